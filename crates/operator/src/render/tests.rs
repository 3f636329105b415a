use super::*;

#[test]
fn fnv_is_stable() {
    assert_eq!(fnv_hex(""), "cbf29ce484222325");
}
