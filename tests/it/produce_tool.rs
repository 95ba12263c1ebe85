//! The produce tool (tests/support/load.rs, `examples/produce.rs`): every copy of a fixture is a
//! distinct segment, and hostile fixtures stay as they are.

use crate::support::load::*;
use replay_ingest::recording;

#[test]
fn replay_ids_are_rewritten_and_everything_else_kept() {
    let original = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/segments/console-0.msgpack"
    ))
    .unwrap();
    let id = random_replay_id();
    let rewritten = with_replay_id(&original, &id).unwrap();
    let (a, b) = (
        recording::process(&original, &Default::default()).unwrap(),
        recording::process(&rewritten, &Default::default()).unwrap(),
    );
    assert_eq!(b.ids.replay_id, id);
    let event_id = |p: &recording::Processed| p.replay_event.as_ref().unwrap().replay_id.unwrap();
    assert_eq!(
        event_id(&b).simple().to_string(),
        id,
        "the replay event's own id follows"
    );
    assert_ne!(event_id(&a), event_id(&b));
    assert_eq!((a.extracted, a.blob.bytes), (b.extracted, b.blob.bytes));
}

#[test]
fn values_without_a_valid_replay_id_are_left_alone() {
    assert_eq!(with_replay_id(b"\x93\x01\x02\x03", "x"), None);
    assert_eq!(with_replay_id(b"garbage", "x"), None);
    let bad = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/synthetic/bad-replay-id.msgpack"
    ))
    .unwrap();
    assert_eq!(with_replay_id(&bad, &random_replay_id()), None);
}
