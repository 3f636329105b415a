//! When a cluster's TLS files stop working: the `notAfter` of its client certificate
//! (`tls.certFile`) and of its trust roots (`tls.caFile`), exported as
//! `infergate_global_cluster_tls_not_after_timestamp_seconds{cluster, file}` so that an alert
//! fires before the date, and a client certificate loaded already outside its validity warned of.
//! A client certificate that expires fails every mutual-TLS handshake with its cluster, and
//! nothing else tells beforehand: the first sign would be the cluster drained.
//!
//! The dates are read with the gateway's reader of a certificate's validity
//! ([`infergate_pool::tls::Validity`]), when a file is loaded: at start, at a reload that
//! builds the cluster anew, and when a rotated file loads (`Cluster::check_files`). A file that
//! changed into something unusable keeps the last good one in force, and with it its date.
//!
//! A CA bundle's date is the earliest `notAfter` of its certificates: from then on a cluster
//! whose certificate chains through that CA fails its handshakes, whatever the others' dates.
//! A date that cannot be read (a certificate of a shape the reader does not expect) is 0, as the
//! gateway's `infergate_tls_certificate_not_after_timestamp_seconds` is: an alert on the time
//! left then fires, which is right for a file nobody can tell the expiry of.

use std::path::Path;

use infergate_pool::tls::{Outside, Validity};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// The `file` label of a client certificate's date (as in `infergate_global_credential_reloads`).
pub(crate) const CLIENT_CERT: &str = "client_cert";
/// The `file` label of a CA bundle's date.
pub(crate) const CA: &str = "ca";

/// The `notAfter` of the client certificate `chain` (leaf first) that `cluster` presents from
/// now on, loaded from `cert`; 0 when it cannot be read (logged at debug level). Warns when the
/// certificate is outside its validity at `now`: it is presented anyway (the cluster decides),
/// but a gateway that verifies it refuses every handshake.
pub(crate) fn client_certificate(
    cluster: &str,
    cert: &Path,
    chain: &[CertificateDer<'_>],
    now: i64,
) -> i64 {
    let Some(validity) = chain.first().and_then(|leaf| Validity::of(leaf)) else {
        unread(cluster, cert, CLIENT_CERT);
        return 0;
    };
    match validity.outside(now) {
        Some(Outside::Expired { seconds_ago }) => tracing::warn!(
            cluster,
            cert = %cert.display(),
            expired_seconds_ago = seconds_ago,
            "the cluster's client certificate (tls.certFile) expired: a cluster asking for one \
             refuses every handshake; renew it and replace the files (they are reloaded)"
        ),
        Some(Outside::NotYetValid { in_seconds }) => tracing::warn!(
            cluster,
            cert = %cert.display(),
            valid_in_seconds = in_seconds,
            "the cluster's client certificate (tls.certFile) is not valid yet (notBefore is in \
             the future; check this host's clock): a cluster asking for one refuses every \
             handshake"
        ),
        None => {}
    }
    validity.not_after
}

/// The earliest `notAfter` of the certificates in `pem`, the CA bundle `ca` of `cluster` in force
/// from now on; 0 when one of them cannot be read (logged at debug level).
pub(crate) fn bundle(cluster: &str, ca: &Path, pem: &[u8]) -> i64 {
    let earliest = CertificateDer::pem_slice_iter(pem)
        .map(|der| der.ok().and_then(|der| Validity::of(&der)))
        .try_fold(i64::MAX, |earliest, v| Some(earliest.min(v?.not_after)));
    match earliest {
        // A bundle in force holds a certificate: `MAX` is never the answer, but not a date.
        Some(at) if at != i64::MAX => at,
        _ => {
            unread(cluster, ca, CA);
            0
        }
    }
}

fn unread(cluster: &str, path: &Path, file: &str) {
    tracing::debug!(
        cluster,
        path = %path.display(),
        file,
        "TLS certificate validity not read; infergate_global_cluster_tls_not_after_timestamp_seconds is 0"
    );
}

#[cfg(test)]
mod tests;
