use std::path::Path;

use infergate_pool::tls::Validity;
use infergate_testkit::tls::TestCa;
use rustls_pki_types::CertificateDer;

use super::{bundle, client_certificate};
use infergate_pool::tls::Outside;

/// 2020-01-01, 2030-01-01 and 2040-01-01, 00:00 UTC.
const Y2020: i64 = 1_577_836_800;
const Y2030: i64 = 1_893_456_000;
const Y2040: i64 = 2_208_988_800;

#[test]
fn a_moment_is_outside_before_not_before_and_after_not_after() {
    let v = Validity {
        not_before: Y2020,
        not_after: Y2030,
    };
    assert_eq!(v.outside(Y2020), None);
    assert_eq!(v.outside(Y2030), None);
    assert_eq!(
        v.outside(Y2030 + 5),
        Some(Outside::Expired { seconds_ago: 5 })
    );
    assert_eq!(
        v.outside(Y2020 - 7),
        Some(Outside::NotYetValid { in_seconds: 7 })
    );
}

/// What `f` logged at debug level and up.
fn logged(f: impl FnOnce()) -> String {
    let out = infergate_testkit::CapturedLog::default();
    let log = tracing::subscriber::set_default(out.subscriber(tracing::Level::DEBUG));
    f();
    drop(log);
    out.text()
}

/// A client certificate expired when it is loaded is warned of, naming the cluster and the file
/// and saying what to do; one in its validity is not; its notAfter is the gauge's value either
/// way.
#[test]
fn an_expired_client_certificate_is_warned_of() {
    let ca = TestCa::new("router CA");
    let chain: [CertificateDer<'static>; 1] =
        [ca.issue_valid(&["router"], (2020, 1, 1), (2030, 1, 1)).der];
    let cert = Path::new("/etc/router/cert.pem");
    // The date read and what was logged, at `now`.
    let load = |now| {
        let mut not_after = 0;
        let text = logged(|| not_after = client_certificate("east", cert, &chain, now));
        (not_after, text)
    };
    let (not_after, text) = load(Y2040);
    assert_eq!(not_after, Y2030);
    let warning = text
        .lines()
        .find(|l| l.contains("WARN"))
        .unwrap_or_else(|| panic!("no warning: {text}"));
    for part in [
        "east",
        "/etc/router/cert.pem",
        "client certificate (tls.certFile) expired",
        "renew it",
        &format!("expired_seconds_ago={}", Y2040 - Y2030),
    ] {
        assert!(warning.contains(part), "{part}: {warning}");
    }

    let (not_after, text) = load(Y2020);
    assert_eq!(not_after, Y2030);
    assert!(!text.contains("WARN"), "{text}");
    let (_, text) = load(Y2020 - 1);
    assert!(
        text.lines()
            .any(|l| l.contains("WARN") && l.contains("not valid yet")),
        "{text}"
    );
}

/// A bundle's date is its earliest certificate's; one whose dates cannot be read is 0.
#[test]
fn a_bundle_expires_with_its_earliest_certificate() {
    let ca = TestCa::new("cluster CA");
    let early = ca.issue_valid(&["a"], (2020, 1, 1), (2030, 1, 1)).cert_pem;
    let late = ca.issue_valid(&["b"], (2020, 1, 1), (2040, 1, 1)).cert_pem;
    let ca_file = Path::new("ca.pem");
    let pem = format!("{}{late}{early}", ca.cert_pem());
    assert_eq!(bundle("east", ca_file, pem.as_bytes()), Y2030);
    assert_eq!(bundle("east", ca_file, late.as_bytes()), Y2040);

    let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    let text = logged(|| {
        assert_eq!(
            bundle("east", ca_file, format!("{late}{garbage}").as_bytes()),
            0
        )
    });
    assert!(text.contains("validity not read"), "{text}");
    assert_eq!(bundle("east", ca_file, b"no certificate"), 0);
    let text = logged(|| assert_eq!(client_certificate("east", ca_file, &[], Y2020), 0));
    assert!(text.contains("validity not read"), "{text}");
}
