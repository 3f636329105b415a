//! `infergate hash-key`: prints the SHA-256 of an API key read from standard input, as the
//! gateway's `auth.apiKeys` expects it (`sha256:`), so the key itself never goes in a file.

use std::io::{Read, Write};

use anyhow::bail;

/// Arguments of `infergate hash-key` (none: the key comes on standard input, so it stays out of
/// the shell history and the process list).
#[derive(Debug, clap::Args)]
pub struct Args {}

/// The key as read: one trailing newline (`\n` or `\r\n`) is not part of it.
fn key_of(input: &[u8]) -> &[u8] {
    let input = input.strip_suffix(b"\n").unwrap_or(input);
    input.strip_suffix(b"\r").unwrap_or(input)
}

/// Runs `infergate hash-key`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    let mut input = Vec::new();
    std::io::stdin().lock().read_to_end(&mut input)?;
    let key = key_of(&input);
    if key.is_empty() {
        bail!("no key on standard input (e.g. `printf %s \"$KEY\" | infergate hash-key`)");
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", infergate_proxy::auth::sha256_hex(key))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_trailing_newline_is_not_part_of_the_key() {
        assert_eq!(key_of(b"sk-1\n"), b"sk-1");
        assert_eq!(key_of(b"sk-1\r\n"), b"sk-1");
        assert_eq!(key_of(b"sk-1"), b"sk-1");
        assert_eq!(key_of(b"sk-1\n\n"), b"sk-1\n");
        // printf %s test | sha256sum
        assert_eq!(
            infergate_proxy::auth::sha256_hex(key_of(b"test\n")),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }
}
