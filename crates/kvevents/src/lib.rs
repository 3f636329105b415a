//! Precise prefix routing from the engines' own KV-cache events.
//!
//! vLLM (`--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq"}'`) publishes
//! every block it stores in or evicts from its prefix cache on a ZeroMQ `PUB` socket. This crate
//! subscribes to each pod's feed ([`subscriber`], over the minimal ZMTP peer in [`zmtp`]), decodes
//! both encodings of the batches ([`event`], with the bounded reader of [`msgpack`]), and keeps an
//! index of which pod holds which token blocks ([`index`]), so the picker can match a request's
//! tokens against what each pod really holds — evictions included — instead of guessing from
//! where it sent earlier prompts. [`publish`] is the same protocol's sending side, for the
//! emulator and the tests.
//!
//! ```
//! use infergate_kvevents::event::{Batch, Event, Stored};
//! use infergate_kvevents::index::{KvIndex, MatchScratch};
//!
//! let pod = "10.0.0.7:8000".parse().unwrap();
//! let mut ix = KvIndex::new(1 << 20);
//! let tokens: Vec<u32> = (0..40).collect();
//! // The engine stored two 16-token blocks of this prompt (the last 8 tokens are no full block).
//! let stored = Stored { block_hashes: vec![11, 12], token_ids: tokens[..32].to_vec(),
//!     block_size: 16, ..Default::default() };
//! ix.apply(pod, &Batch { events: vec![Event::Stored(stored)], ..Default::default() });
//! ix.set_synced(pod, true);
//! let (mut scratch, mut out) = (MatchScratch::default(), Vec::new());
//! ix.match_tokens(None, None, &tokens, &mut scratch, &mut out);
//! assert_eq!(out, [(pod, 32)]);
//! ```

pub mod error;
pub mod event;
pub mod index;
pub mod msgpack;
pub mod publish;
pub mod subscriber;
pub mod zmtp;

pub use error::{DecodeError, ZmtpError};
pub use index::{IndexStats, KvIndex, MatchScratch};
pub use subscriber::{Feed, KvEvents, SubscriberConfig};
