//! How fast a GPU type is relative to an H100 SXM, from its published specifications: the
//! cold-start prior of the learned rates (the crate-internal `rates` module).
//!
//! An endpoint's prefill and decode speeds are learned from its own requests. Before its first
//! sample it is assumed to run at the pool's typical speed; without this table, in a pool of
//! H100s and A10Gs an A10G that has not served yet is assumed as fast as the H100s that have, and
//! the first long prompts sent to it wait eight times longer than expected. With the endpoint's
//! GPU type known (the `gpu` of a standalone endpoint, the `infergate.dev/gpu` pod label on
//! Kubernetes; `4xH100` for a server over four GPUs), the typical speed is kept per H100-equivalent and scaled by each endpoint's
//! factor: prefill by dense BF16 tensor throughput (FP16 where the part has no BF16), decode by
//! memory bandwidth. A learned rate always replaces the prior; an endpoint whose GPU is unknown
//! (or not in the table) counts as the reference, which is what every endpoint counted as before
//! GPU types were read.

/// Speed of a GPU type relative to an H100 SXM (1.0 both).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct GpuSpeed {
    /// Prefill (compute-bound): dense tensor throughput over the H100 SXM's 989 TFLOPS.
    pub prefill: f64,
    /// Decode (bandwidth-bound): memory bandwidth over the H100 SXM's 3.35 TB/s.
    pub decode: f64,
}

impl GpuSpeed {
    /// The reference, an H100 SXM; also what an unknown GPU type counts as.
    pub const REFERENCE: GpuSpeed = GpuSpeed {
        prefill: 1.0,
        decode: 1.0,
    };
}

const REF_TFLOPS: f64 = 989.0;
const REF_TBPS: f64 = 3.35;

/// `(pattern, dense BF16/FP16 tensor TFLOPS, memory TB/s)` from the vendors' datasheets, matched
/// in order against the GPU name lowercased with everything but letters and digits removed (so
/// `H100-SXM-80GB`, `nvidia-h100-80gb-hbm3` and `h100` all match `h100`); longer names first where
/// one contains another.
const TABLE: &[(&str, f64, f64)] = &[
    ("b200", 2250.0, 8.0),
    ("gh200", 989.0, 4.0),
    ("h200", 989.0, 4.8),
    ("h100pcie", 756.0, 2.0),
    ("h100nvl", 835.0, 3.9),
    ("h100", 989.0, 3.35),
    ("h800", 989.0, 3.35),
    ("mi300x", 1307.0, 5.3),
    ("a100", 312.0, 2.0),
    ("a800", 312.0, 2.0),
    ("l40s", 362.0, 0.864),
    ("l40", 181.0, 0.864),
    ("a10", 125.0, 0.6),
    ("l4", 121.0, 0.3),
    ("v100", 125.0, 0.9),
    ("t4", 65.0, 0.32),
];

/// The relative speed of the GPU type `name`, `None` when it is not in the table. A count
/// before or after the name (`4xH100`, `4 x H100`, `H100x4`: a server over four GPUs with tensor
/// parallelism) multiplies both factors, as ideal tensor-parallel scaling would.
pub fn speed_of(name: &str) -> Option<GpuSpeed> {
    let key: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    let (count, key) = split_count(&key);
    TABLE
        .iter()
        .find(|(pattern, _, _)| key.contains(pattern))
        .map(|&(_, tflops, tbps)| GpuSpeed {
            prefill: count * tflops / REF_TFLOPS,
            decode: count * tbps / REF_TBPS,
        })
}

/// `4xh100` → (4, `h100`); `h100x4` → (4, `h100`); otherwise (1, the key). Counts from 1 to 64.
fn split_count(key: &str) -> (f64, &str) {
    let valid = |n: &str| n.parse::<u32>().ok().filter(|n| (1..=64).contains(n));
    let digits = key.len() - key.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    if digits > 0
        && let Some(rest) = key[digits..].strip_prefix('x')
        && let Some(n) = valid(&key[..digits])
        && !rest.is_empty()
    {
        return (f64::from(n), rest);
    }
    let tail = key.len() - key.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if tail > 0 {
        let (head, n) = key.split_at(key.len() - tail);
        if let Some(head) = head.strip_suffix('x')
            && let Some(n) = valid(n)
            && !head.is_empty()
        {
            return (f64::from(n), head);
        }
    }
    (1.0, key)
}

/// An endpoint's speed factors, pre-digested for the pick (crate-internal).
#[derive(Copy, Clone, Debug)]
pub(crate) struct SpeedFactors {
    /// `ln` of the prefill and decode factors: learned rates enter the pool's typical speed
    /// divided by them.
    pub(crate) ln_prefill: f64,
    pub(crate) ln_decode: f64,
    /// `1 / prefill factor`, so the pick multiplies the pool's inverse prior.
    pub(crate) inv_prefill: f64,
    pub(crate) decode: f64,
    /// `1 / decode factor`, for the same reason.
    pub(crate) inv_decode: f64,
}

impl SpeedFactors {
    pub(crate) fn of(gpu: Option<&str>) -> Self {
        let s = gpu.and_then(speed_of).unwrap_or(GpuSpeed::REFERENCE);
        SpeedFactors {
            ln_prefill: s.prefill.ln(),
            ln_decode: s.decode.ln(),
            inv_prefill: 1.0 / s.prefill,
            decode: s.decode,
            inv_decode: 1.0 / s.decode,
        }
    }
}

impl Default for SpeedFactors {
    fn default() -> Self {
        SpeedFactors::of(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_written_in_profiles_labels_and_node_labels_match() {
        let h100 = speed_of("H100-SXM-80GB").unwrap();
        assert_eq!(h100, GpuSpeed::REFERENCE);
        assert_eq!(speed_of("nvidia-h100-80gb-hbm3"), Some(h100));
        let a10g = speed_of("A10G-24GB").unwrap();
        // 125 / 989 TFLOPS; 0.6 / 3.35 TB/s.
        assert!((1.0 / a10g.prefill - 7.912).abs() < 0.01, "{a10g:?}");
        assert!((1.0 / a10g.decode - 5.583).abs() < 0.01, "{a10g:?}");
        assert_eq!(speed_of("NVIDIA-A10G"), Some(a10g));
        // Longer names win over the shorter ones they contain.
        assert!(speed_of("A100-80GB").unwrap().prefill > a10g.prefill);
        assert!(speed_of("L40S").unwrap().prefill > speed_of("L40").unwrap().prefill);
        assert!(speed_of("NVIDIA-L4").unwrap().decode < speed_of("L40S").unwrap().decode);
        assert!(speed_of("H100 PCIe").unwrap().prefill < 1.0);
        assert_eq!(speed_of("tpu-v5e"), None);
        // Tensor-parallel servers: a count before or after.
        let four = speed_of("4xH100").unwrap();
        assert_eq!((four.prefill, four.decode), (4.0, 4.0));
        assert_eq!(speed_of("H100x4"), Some(four));
        assert_eq!(speed_of("4 x H100-SXM-80GB"), Some(four));
        let a10g8 = speed_of("8xA10G-24GB").unwrap();
        assert!((a10g8.prefill - 8.0 * a10g.prefill).abs() < 1e-12);
        // Names that end in digits or an x are not counts.
        assert_eq!(speed_of("MI300X"), speed_of("mi300x"));
        assert!(speed_of("MI300X").unwrap().prefill < 2.0);
        assert_eq!(speed_of("H100-SXM-80GB"), Some(h100));
        assert_eq!(speed_of("0xH100"), Some(h100), "a count of 0 is no count");
        assert_eq!(speed_of(""), None);
    }

    #[test]
    fn unknown_gpus_count_as_the_reference() {
        let f = SpeedFactors::of(Some("something new"));
        assert_eq!(
            (f.ln_prefill, f.ln_decode, f.inv_prefill, f.decode),
            (0.0, 0.0, 1.0, 1.0)
        );
        assert_eq!(SpeedFactors::of(None).inv_prefill, 1.0);
    }
}
