use super::*;

fn hashes(seed: u64, segs: &[&str], block: usize) -> Vec<u64> {
    let mut v = Vec::new();
    hash_blocks(seed, segs, block, 1024, &mut v);
    v
}

#[test]
fn segments_hash_like_their_concatenation() {
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(20);
    let whole = hashes(7, &[text.as_str()], 64);
    assert_eq!(whole.len(), text.len() / 64);
    for cut in [1, 63, 64, 65, 100, 500] {
        let (a, b) = text.split_at(cut);
        assert_eq!(hashes(7, &[a, b], 64), whole, "cut at {cut}");
    }
    let pieces: Vec<&str> = text
        .as_bytes()
        .chunks(7)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    assert_eq!(hashes(7, &pieces, 64), whole);
}
