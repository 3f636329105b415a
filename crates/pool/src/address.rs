//! Listening addresses in configuration files: an IP address and a port. A port alone
//! (`listen: 8080`, a YAML number) or a host name is refused saying what to write, where the
//! standard parser says only "invalid socket address syntax"; the error is raised inside the
//! parser, so it carries the field and the line.

use std::net::SocketAddr;

/// Deserializes a [`SocketAddr`] as `#[serde(deserialize_with = "infergate_pool::address::deserialize")]`.
pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    d.deserialize_any(AddressVisitor)
}

struct AddressVisitor;

fn refused<E: serde::de::Error>(text: &dyn std::fmt::Display) -> E {
    E::custom(format!(
        "`{text}` is not an address: write an IP address and a port, e.g. 0.0.0.0:8080 or \
         127.0.0.1:9091 (a host name is not resolved)"
    ))
}

impl serde::de::Visitor<'_> for AddressVisitor {
    type Value = SocketAddr;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an IP address and a port, e.g. 0.0.0.0:8080")
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<SocketAddr, E> {
        text.parse().map_err(|_| refused(&text))
    }

    fn visit_u64<E: serde::de::Error>(self, port: u64) -> Result<SocketAddr, E> {
        Err(refused(&port))
    }

    fn visit_i64<E: serde::de::Error>(self, port: i64) -> Result<SocketAddr, E> {
        Err(refused(&port))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    #[derive(serde::Deserialize, Debug)]
    struct C {
        #[serde(deserialize_with = "super::deserialize")]
        listen: std::net::SocketAddr,
    }

    #[test]
    fn an_ip_and_port_is_read_and_anything_else_says_what_to_write() {
        let c: C = serde_yaml::from_str("listen: 0.0.0.0:8080").unwrap();
        assert_eq!(c.listen.port(), 8080);
        let c: C = serde_yaml::from_str("listen: '[::1]:9'").unwrap();
        assert!(c.listen.is_ipv6());
        for (bad, shown) in [
            ("8080", "8080"),
            ("-1", "-1"),
            ("localhost:8080", "localhost:8080"),
        ] {
            let e = serde_yaml::from_str::<C>(&format!("listen: {bad}"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!(
                    "`{shown}` is not an address: write an IP address and a port"
                )),
                "{bad}: {e}"
            );
            assert!(e.contains("line 1"), "{e}");
        }
    }
}
