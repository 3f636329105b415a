//! One module per subcommand. Each exposes `Args` (clap) and `async fn run(Args)`.

pub mod bbr;
pub mod bench;
pub mod crdgen;
pub mod demo;
pub mod gateway;
pub mod operator;
pub mod picker;
pub mod sim;
