//! The Kafka message value: a msgpack map with string keys (docs/formats.md, "The message").
//!
//! ```text
//! { "type": "replay_recording_not_chunked", "replay_id": "<32 hex>", "key_id": int|nil,
//!   "org_id": uint, "project_id": uint, "received": uint (unix s), "retention_days": uint16,
//!   "payload": bin, "replay_event": bin|nil, "replay_video": bin|nil,
//!   "relay_snuba_publish_disabled": bool, ...unknown keys (`version` among them) ignored }
//! ```
//! Byte fields are borrowed from the message: decoding copies nothing large.

use serde::Deserialize;

use super::error::{InvalidRecording, Reason};

/// The only message type this service accepts.
pub const RECORDING_TYPE: &str = "replay_recording_not_chunked";

/// The latest `received` accepted: 2106-02-07T06:28:15Z, the last second a ClickHouse `DateTime`
/// holds. Every reader of what a segment produces stores `received` as one — the rows'
/// `timestamp`, the billing outcome's `timestamp` in snuba's outcomes tables — and Sentry's own
/// consumer fails on anything past year 9999 (`datetime.fromtimestamp`). The edge writes its
/// receive time here, so a later value is corrupt or forged: dead-lettered, never clamped.
pub const MAX_RECEIVED: u64 = u32::MAX as u64;

/// Retention applied when the message says 0 or nothing.
pub const DEFAULT_RETENTION_DAYS: u16 = 30;

/// A validated message value. Borrows its byte fields from the raw Kafka value.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope<'a> {
    /// 32 lowercase hex characters (a UUID without dashes).
    pub replay_id: &'a str,
    /// The same id, parsed.
    pub replay_uuid: uuid::Uuid,
    /// DSN key id; reported in billing outcomes.
    pub key_id: Option<u64>,
    pub org_id: u64,
    pub project_id: u64,
    /// Unix seconds when the edge received the segment.
    pub received: u64,
    /// Days the blob and rows are kept; selects the blob key prefix and the row partition.
    pub retention_days: u16,
    /// `{"segment_id":N}\n<body>`.
    pub payload: &'a [u8],
    /// Optional JSON describing the replay (urls, user, sdk, …).
    pub replay_event: Option<&'a [u8]>,
    /// Optional raw video bytes (mobile SDKs).
    pub replay_video: Option<&'a [u8]>,
    /// When true the edge did not publish the replay event, so this service writes its row.
    pub relay_snuba_publish_disabled: bool,
}

/// Wire shape: everything optional so that a missing field gets its own `reason`.
#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<&'a str>,
    #[serde(borrow)]
    replay_id: Option<&'a str>,
    key_id: Option<u64>,
    org_id: Option<u64>,
    project_id: Option<u64>,
    received: Option<u64>,
    retention_days: Option<u16>,
    #[serde(borrow, with = "serde_bytes", default)]
    payload: Option<&'a [u8]>,
    #[serde(borrow, with = "serde_bytes", default)]
    replay_event: Option<&'a [u8]>,
    #[serde(borrow, with = "serde_bytes", default)]
    replay_video: Option<&'a [u8]>,
    relay_snuba_publish_disabled: Option<bool>,
}

/// Decodes and validates the msgpack map.
pub fn decode(value: &[u8]) -> Result<Envelope<'_>, InvalidRecording> {
    // rmp-serde would also accept an array (positional struct); the contract is a map.
    match value.first() {
        Some(&marker) if is_map_marker(marker) => {}
        Some(marker) => {
            return Err(InvalidRecording::new(
                Reason::InvalidMsgpack,
                format_args!("value is not a msgpack map (first byte 0x{marker:02x})"),
            ));
        }
        None => {
            return Err(InvalidRecording::new(
                Reason::InvalidMsgpack,
                "empty message value",
            ));
        }
    }
    let wire: Wire<'_> = rmp_serde::from_slice(value)
        .map_err(|e| InvalidRecording::new(Reason::InvalidMsgpack, e))?;

    match wire.kind {
        Some(RECORDING_TYPE) => {}
        Some(other) => {
            return Err(InvalidRecording::new(
                Reason::WrongType,
                format_args!("type is {other:?}, expected {RECORDING_TYPE:?}"),
            ));
        }
        None => return Err(InvalidRecording::new(Reason::WrongType, "type is missing")),
    }
    let replay_id = required(wire.replay_id, "replay_id")?;
    let replay_uuid = uuid::Uuid::try_parse(replay_id)
        .ok()
        .filter(|_| is_replay_id(replay_id))
        .ok_or_else(|| {
            InvalidRecording::new(
                Reason::InvalidReplayId,
                format_args!("replay_id {replay_id:?} is not 32 lowercase hex characters"),
            )
        })?;
    let org_id = required(wire.org_id, "org_id")?;
    let project_id = required(wire.project_id, "project_id")?;
    let received = required(wire.received, "received")?;
    if received > MAX_RECEIVED {
        return Err(InvalidRecording::new(
            Reason::InvalidReceived,
            format_args!(
                "received {received} is later than {MAX_RECEIVED} (2106-02-07T06:28:15Z), the last second the outputs can hold"
            ),
        ));
    }
    Ok(Envelope {
        replay_id,
        replay_uuid,
        key_id: wire.key_id,
        org_id,
        project_id,
        received,
        retention_days: match wire.retention_days {
            None | Some(0) => DEFAULT_RETENTION_DAYS,
            Some(days) => days,
        },
        payload: required(wire.payload, "payload")?,
        // Sentry treats an empty replay event, JSON `null` and an empty object as none (`if
        // recording.replay_event:` — an empty dict is false): no segment row, nothing of it.
        replay_event: wire.replay_event.filter(|json| !is_none(json)),
        replay_video: wire.replay_video,
        relay_snuba_publish_disabled: wire.relay_snuba_publish_disabled.unwrap_or(false),
    })
}

/// Whether a replay event's JSON is what Python reads as false: nothing, `null`, `false`, a
/// zero, `""`, `[]` or `{}`.
fn is_none(json: &[u8]) -> bool {
    match json.trim_ascii() {
        b"" | br#""""# => true,
        [b'{', inner @ .., b'}'] | [b'[', inner @ .., b']'] => inner.trim_ascii().is_empty(),
        // A scalar that is false is short; anything longer is not one.
        scalar if scalar.len() <= 32 => {
            matches!(
                serde_json::from_slice(scalar),
                Ok(serde_json::Value::Null | serde_json::Value::Bool(false))
            ) || matches!(serde_json::from_slice::<f64>(scalar), Ok(n) if n == 0.0)
        }
        _ => false,
    }
}

/// Whose message `value` is — its project and replay — read leniently: those two fields alone,
/// whatever the others hold (a dead letter is a message that did not process). `None` when
/// either is missing or malformed, or `value` is not a msgpack map. Copies nothing large.
pub fn owner(value: &[u8]) -> Option<(u64, uuid::Uuid)> {
    #[derive(Deserialize)]
    struct Owner<'a> {
        project_id: Option<u64>,
        #[serde(borrow)]
        replay_id: Option<&'a str>,
    }
    let owner: Owner<'_> = lenient(value)?;
    let replay = uuid::Uuid::try_parse(owner.replay_id?).ok()?;
    Some((owner.project_id?, replay))
}

/// A message's `payload` field, from a quick look before it is processed.
pub enum Field<'a> {
    /// The payload, and whether the message carries a video (non-empty `replay_video`: the blob
    /// then packs both, re-encoded).
    Read { payload: &'a [u8], with_video: bool },
    /// Not there, or `value` is no map: processing refuses the message.
    Absent,
    /// Not read: the map has more keys than a quick look reads, or nesting deeper than it
    /// follows. Processing may still accept it.
    Unread,
}

/// The `payload` field of `value` (`{"segment_id":N}\n<body>`), and whether a video comes with
/// it, read leniently as [`owner`] reads its fields, before the message is processed: what the
/// processing window reserves for it depends on its body's encoding, and on how its blob is
/// built. Copies nothing; reads at most [`QUICK_LOOK_KEYS`] keys.
pub fn payload(value: &[u8]) -> Field<'_> {
    #[derive(Deserialize)]
    struct Payload<'a> {
        #[serde(borrow, with = "serde_bytes", default)]
        payload: Option<&'a [u8]>,
        #[serde(borrow, with = "serde_bytes", default)]
        replay_video: Option<&'a [u8]>,
    }
    let keys = match value {
        [marker @ 0x80..=0x8f, ..] => usize::from(marker & 0x0f),
        [0xde, a, b, ..] => usize::from(u16::from_be_bytes([*a, *b])),
        [0xdf, a, b, c, d, ..] => u32::from_be_bytes([*a, *b, *c, *d]) as usize,
        _ => return Field::Absent,
    };
    if keys > QUICK_LOOK_KEYS {
        return Field::Unread;
    }
    match lenient::<Payload<'_>>(value) {
        Some(Payload {
            payload: Some(payload),
            replay_video,
        }) => Field::Read {
            payload,
            with_video: replay_video.is_some_and(|video| !video.is_empty()),
        },
        Some(Payload { payload: None, .. }) => Field::Absent,
        None => Field::Unread,
    }
}

/// Keys a quick look reads: a message has about a dozen.
const QUICK_LOOK_KEYS: usize = 64;

/// Some fields of the msgpack map `value`, whatever the others hold; `None` when `value` is not
/// a map or those fields are malformed.
fn lenient<'a, T: Deserialize<'a>>(value: &'a [u8]) -> Option<T> {
    if !value.first().is_some_and(|&marker| is_map_marker(marker)) {
        return None;
    }
    // Read on a flush's thread (or the pipeline's), whose stack is the runtime's default: a
    // value nested deeper than any message is (hostile) yields nothing instead of recursing
    // 1 024 levels.
    let mut decoder = rmp_serde::Deserializer::from_read_ref(value);
    decoder.set_max_depth(LENIENT_MAX_DEPTH);
    T::deserialize(&mut decoder).ok()
}

/// Nesting [`lenient`] reads through: a message's map holds scalars and byte strings.
const LENIENT_MAX_DEPTH: usize = 16;

/// A msgpack map's first byte (fixmap, map 16, map 32).
fn is_map_marker(marker: u8) -> bool {
    matches!(marker, 0x80..=0x8f | 0xde | 0xdf)
}

fn required<T>(field: Option<T>, name: &str) -> Result<T, InvalidRecording> {
    field.ok_or_else(|| {
        InvalidRecording::new(Reason::MissingField, format_args!("{name} is missing"))
    })
}

/// 32 lowercase hex characters: a UUID without dashes.
pub fn is_replay_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn whose_message_it_is_is_read_leniently_from_its_msgpack() {
        let value = rmp_serde::to_vec_named(&serde_json::json!({
            "type": 7, "org_id": "not a number", "project_id": 42,
            "replay_id": "834F314C-AAE5-4030-A1B0-DC52B202F24A", "payload": "garbage"
        }))
        .unwrap();
        assert_eq!(
            owner(&value).map(|(project, replay)| (project, replay.simple().to_string())),
            Some((42, "834f314caae54030a1b0dc52b202f24a".into())),
            "whatever the other fields hold"
        );
        assert_eq!(owner(b"\xc1 not msgpack"), None);
        let no_project = rmp_serde::to_vec_named(
            &serde_json::json!({"replay_id": "834f314caae54030a1b0dc52b202f24a"}),
        )
        .unwrap();
        assert_eq!(owner(&no_project), None);
        // A field nested deeper than any message is: no owner, and no deep recursion.
        let mut deep =
            b"\x83\xaaproject_id\x2a\xa9replay_id\xd9\x20834f314caae54030a1b0dc52b202f24a\xa1x"
                .to_vec();
        deep.extend(std::iter::repeat_n(0x91, 100_000));
        deep.push(0xc0);
        assert_eq!(owner(&deep), None);
    }
    use serde::Serialize;

    /// A well-formed message value, for tests across the crate.
    #[derive(Serialize, Clone)]
    pub(crate) struct TestMessage {
        #[serde(rename = "type")]
        pub kind: &'static str,
        pub replay_id: String,
        pub key_id: Option<u64>,
        pub org_id: u64,
        pub project_id: u64,
        pub received: u64,
        pub retention_days: u16,
        #[serde(with = "serde_bytes")]
        pub payload: Vec<u8>,
        #[serde(with = "serde_bytes")]
        pub replay_event: Option<Vec<u8>>,
        #[serde(with = "serde_bytes")]
        pub replay_video: Option<Vec<u8>>,
        pub version: i64,
        pub relay_snuba_publish_disabled: bool,
    }

    impl TestMessage {
        pub(crate) fn new(payload: Vec<u8>) -> Self {
            TestMessage {
                kind: RECORDING_TYPE,
                replay_id: "6aa0d45db9b94b989501ce3be4daf802".into(),
                key_id: Some(7),
                org_id: 1,
                project_id: 42,
                received: 1_796_012_448,
                retention_days: 90,
                payload,
                replay_event: None,
                replay_video: None,
                version: 0,
                relay_snuba_publish_disabled: false,
            }
        }

        pub(crate) fn encode(&self) -> Vec<u8> {
            rmp_serde::to_vec_named(self).unwrap()
        }
    }

    fn reason(value: &[u8]) -> Reason {
        decode(value).unwrap_err().reason
    }

    #[test]
    fn decodes_every_field_and_borrows_the_payload() {
        let msg = TestMessage::new(b"{\"segment_id\":0}\n[]".to_vec());
        let bytes = msg.encode();
        let env = decode(&bytes).unwrap();
        assert_eq!(env.replay_id, msg.replay_id);
        assert_eq!((env.org_id, env.project_id, env.key_id), (1, 42, Some(7)));
        assert_eq!((env.received, env.retention_days), (1_796_012_448, 90));
        assert_eq!(env.payload, msg.payload.as_slice());
        assert!(bytes.as_ptr_range().contains(&env.payload.as_ptr()));
    }

    #[test]
    fn an_empty_or_null_replay_event_is_none_as_sentry_reads_it() {
        for (sent, kept) in [
            (&b""[..], None),
            (b"null", None),
            (b" null\n", None),
            (b"{}", None),
            (b" { \n} ", None),
            (b"[ ]", None),
            (b"false", None),
            (b"0", None),
            (b"-0.0", None),
            (br#""""#, None),
            (br#"{"a":1}"#, Some(&br#"{"a":1}"#[..])),
            (b"[0]", Some(&b"[0]"[..])),
            (b"1", Some(&b"1"[..])),
            (b"nul", Some(&b"nul"[..])),
        ] {
            let msg = TestMessage {
                replay_event: Some(sent.to_vec()),
                ..TestMessage::new(b"{\"segment_id\":0}\n[]".to_vec())
            };
            let bytes = msg.encode();
            assert_eq!(decode(&bytes).unwrap().replay_event, kept, "{sent:?}");
        }
    }

    #[test]
    fn unknown_keys_are_ignored() {
        #[derive(Serialize)]
        struct WithExtra {
            #[serde(flatten)]
            msg: TestMessage,
            something_new: Vec<u32>,
        }
        let bytes = rmp_serde::to_vec_named(&WithExtra {
            msg: TestMessage::new(b"{\"segment_id\":0}\n[]".to_vec()),
            something_new: vec![1, 2],
        })
        .unwrap();
        assert!(decode(&bytes).is_ok());
    }

    #[test]
    fn zero_or_missing_retention_means_thirty_days() {
        let mut msg = TestMessage::new(b"x".to_vec());
        msg.retention_days = 0;
        assert_eq!(decode(&msg.encode()).unwrap().retention_days, 30);
    }

    #[test]
    fn a_msgpack_array_is_not_a_message() {
        let bytes = rmp_serde::to_vec(&TestMessage::new(b"x".to_vec())).unwrap();
        assert_eq!(reason(&bytes), Reason::InvalidMsgpack);
        assert_eq!(reason(b""), Reason::InvalidMsgpack);
        assert_eq!(reason(&[0x81, 0xa1]), Reason::InvalidMsgpack);
    }

    #[test]
    fn the_type_must_be_replay_recording_not_chunked() {
        let mut msg = TestMessage::new(b"x".to_vec());
        msg.kind = "replay_recording";
        assert_eq!(reason(&msg.encode()), Reason::WrongType);
    }

    #[test]
    fn replay_ids_must_be_32_lowercase_hex() {
        for bad in [
            "6AA0D45DB9B94B989501CE3BE4DAF802",
            "6aa0d45d-b9b9-4b98-9501-ce3be4daf802",
            "xyz",
            "",
        ] {
            let mut msg = TestMessage::new(b"x".to_vec());
            msg.replay_id = bad.into();
            assert_eq!(reason(&msg.encode()), Reason::InvalidReplayId, "{bad}");
        }
    }

    /// The test message as a msgpack map, changed by `change`, encoded again.
    fn edited(change: impl FnOnce(&mut Vec<(rmpv::Value, rmpv::Value)>)) -> Vec<u8> {
        let encoded = TestMessage::new(b"{\"segment_id\":0}\n[]".to_vec()).encode();
        let rmpv::Value::Map(mut map) = rmpv::decode::read_value(&mut &encoded[..]).unwrap() else {
            unreachable!("the test message is a map")
        };
        change(&mut map);
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &rmpv::Value::Map(map)).unwrap();
        out
    }

    #[test]
    fn each_required_field_missing_is_named() {
        for field in ["replay_id", "org_id", "project_id", "received", "payload"] {
            let bytes = edited(|map| map.retain(|(k, _)| k.as_str() != Some(field)));
            let err = decode(&bytes).unwrap_err();
            assert_eq!(
                (err.reason, err.detail),
                (Reason::MissingField, format!("{field} is missing"))
            );
        }
        let without_type = edited(|map| map.retain(|(k, _)| k.as_str() != Some("type")));
        let err = decode(&without_type).unwrap_err();
        assert_eq!(
            (err.reason, err.detail.as_str()),
            (Reason::WrongType, "type is missing")
        );
        // Optional fields may be absent.
        for field in [
            "key_id",
            "retention_days",
            "replay_event",
            "replay_video",
            "version",
        ] {
            assert!(
                decode(&edited(|map| map.retain(|(k, _)| k.as_str() != Some(field)))).is_ok(),
                "{field}"
            );
        }
    }

    #[test]
    fn received_past_what_a_datetime_column_holds_is_invalid_received() {
        let with = |received: u64| {
            edited(|map| {
                let field = map
                    .iter_mut()
                    .find(|(k, _)| k.as_str() == Some("received"))
                    .unwrap();
                field.1 = rmpv::Value::from(received);
            })
        };
        for ok in [0, 1_796_012_448, MAX_RECEIVED] {
            assert_eq!(decode(&with(ok)).unwrap().received, ok);
        }
        for far in [MAX_RECEIVED + 1, 253_402_300_800, u64::MAX] {
            let err = decode(&with(far)).unwrap_err();
            assert_eq!(err.reason, Reason::InvalidReceived, "{far}");
            assert!(err.detail.contains(&far.to_string()), "{}", err.detail);
        }
    }

    #[test]
    fn a_field_of_the_wrong_msgpack_type_is_invalid_msgpack() {
        for (field, value) in [
            ("type", rmpv::Value::from(5)),
            ("replay_id", rmpv::Value::from(5)),
            ("org_id", rmpv::Value::from("1")),
            ("project_id", rmpv::Value::from(-1)),
            ("received", rmpv::Value::from(1.5)),
            ("payload", rmpv::Value::from(7)),
            ("retention_days", rmpv::Value::from(70_000)),
            ("replay_event", rmpv::Value::Array(vec![])),
        ] {
            let bytes = edited(|map| {
                let slot = map
                    .iter_mut()
                    .find(|(k, _)| k.as_str() == Some(field))
                    .unwrap();
                slot.1 = value.clone();
            });
            let err = decode(&bytes).unwrap_err();
            assert_eq!(
                err.reason,
                Reason::InvalidMsgpack,
                "{field} = {value}: {}",
                err.detail
            );
        }
    }

    #[test]
    fn missing_tenant_ids_are_named() {
        #[derive(Serialize)]
        struct NoOrg {
            #[serde(rename = "type")]
            kind: &'static str,
            replay_id: &'static str,
            project_id: u64,
            received: u64,
            #[serde(with = "serde_bytes")]
            payload: Vec<u8>,
        }
        let bytes = rmp_serde::to_vec_named(&NoOrg {
            kind: RECORDING_TYPE,
            replay_id: "6aa0d45db9b94b989501ce3be4daf802",
            project_id: 1,
            received: 1,
            payload: b"x".to_vec(),
        })
        .unwrap();
        let err = decode(&bytes).unwrap_err();
        assert_eq!(
            (err.reason, err.detail.as_str()),
            (Reason::MissingField, "org_id is missing")
        );
    }
}
