use super::*;

fn lease(holder: Option<&str>) -> Lease {
    Lease {
        metadata: ObjectMeta::default(),
        spec: Some(LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            ..LeaseSpec::default()
        }),
    }
}

#[test]
fn decisions() {
    let d = Duration::from_secs(15);
    assert_eq!(decide(None, "a", Duration::ZERO, d), Decision::Create);
    assert_eq!(
        decide(Some(&lease(Some("a"))), "a", Duration::ZERO, d),
        Decision::Renew
    );
    assert_eq!(
        decide(Some(&lease(Some("b"))), "a", Duration::from_secs(14), d),
        Decision::Wait
    );
    assert_eq!(
        decide(Some(&lease(Some("b"))), "a", Duration::from_secs(15), d),
        Decision::TakeOver
    );
    assert_eq!(
        decide(Some(&lease(None)), "a", Duration::ZERO, d),
        Decision::TakeOver
    );
    assert_eq!(
        decide(Some(&lease(Some(""))), "a", Duration::ZERO, d),
        Decision::TakeOver
    );
}
