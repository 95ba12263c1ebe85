//! The protobuf wire form of `sentry_protos.snuba.v1.TraceItem` (sentry-protos,
//! `proto/sentry_protos/snuba/v1/trace_item.proto`), written directly: the few fields a replay
//! item has, in field-number order, the attributes in the order they are added. So the same item
//! is always the same bytes (prost would write the attribute map in a random order), and the
//! service carries no gRPC stack. The tests decode every item with the `sentry_protos` bindings
//! that Snuba's consumer uses.

/// `TraceItemType::Replay`.
pub const ITEM_TYPE_REPLAY: u64 = 6;

/// A value of the attribute map (`AnyValue`): the four kinds a replay item uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    Str(&'a str),
    Bool(bool),
    Int(i64),
    Double(f64),
}

/// Appends one attribute (a `map<string, AnyValue>` entry of field 7) to `out`, lengths
/// computed rather than the parts built apart (this runs for every attribute of every item).
pub fn attribute(out: &mut Vec<u8>, key: &str, value: Value<'_>) {
    let any_len = match value {
        Value::Str(s) => 1 + varint_len(s.len() as u64) + s.len(),
        Value::Bool(_) => 2,
        Value::Int(i) => 1 + varint_len(i as u64),
        Value::Double(_) => 9,
    };
    let key_len = 1 + varint_len(key.len() as u64) + key.len();
    let entry_len = key_len + 1 + varint_len(any_len as u64) + any_len;
    field_key(out, 7, 2);
    varint(out, entry_len as u64);
    bytes_field(out, 1, key.as_bytes());
    field_key(out, 2, 2);
    varint(out, any_len as u64);
    match value {
        // Oneof members are written even when they hold their type's default.
        Value::Str(s) => bytes_field(out, 1, s.as_bytes()),
        Value::Bool(b) => varint_field(out, 2, u64::from(b)),
        Value::Int(i) => varint_field(out, 3, i as u64),
        Value::Double(d) => double_field(out, 4, d),
    }
}

/// A `google.protobuf.Timestamp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timestamp {
    pub seconds: i64,
    pub nanos: i32,
}

impl Timestamp {
    /// Milliseconds since the epoch (UTC), floored to the second with the rest as nanos.
    pub fn from_millis(ms: i64) -> Timestamp {
        Timestamp {
            seconds: ms.div_euclid(1000),
            nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
        }
    }

    /// Appends the timestamp as message field `field` (a zero part is left out, as proto3 does).
    fn field(self, out: &mut Vec<u8>, field: u32) {
        let seconds = (self.seconds != 0).then_some(self.seconds as u64);
        let nanos = (self.nanos != 0).then_some(i64::from(self.nanos) as u64);
        let len = [seconds, nanos]
            .into_iter()
            .flatten()
            .map(|v| 1 + varint_len(v))
            .sum::<usize>();
        field_key(out, field, 2);
        varint(out, len as u64);
        if let Some(seconds) = seconds {
            varint_field(out, 1, seconds);
        }
        if let Some(nanos) = nanos {
            varint_field(out, 2, nanos);
        }
    }
}

/// The fields of an item other than its attributes.
pub struct Header<'a> {
    pub organization_id: u64,
    pub project_id: u64,
    pub trace_id: &'a str,
    pub item_id: [u8; 16],
    pub timestamp: Timestamp,
    pub retention_days: u32,
    pub received: Timestamp,
}

/// Appends one whole `TraceItem` to `out`: `header`, then `attributes` (already encoded entries),
/// then the sample rates (1.0: replays are not sampled server side) and the internal fields.
pub fn item(out: &mut Vec<u8>, header: &Header<'_>, attributes: &[&[u8]]) {
    varint_field(out, 1, header.organization_id);
    varint_field(out, 2, header.project_id);
    bytes_field(out, 3, header.trace_id.as_bytes());
    bytes_field(out, 4, &header.item_id);
    varint_field(out, 5, ITEM_TYPE_REPLAY);
    header.timestamp.field(out, 6);
    for part in attributes {
        out.extend_from_slice(part);
    }
    double_field(out, 8, 1.0);
    double_field(out, 9, 1.0);
    varint_field(out, 100, u64::from(header.retention_days));
    header.received.field(out, 101);
}

fn field_key(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire_type));
}

fn varint_len(value: u64) -> usize {
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
    field_key(out, field, 0);
    varint(out, value);
}

fn double_field(out: &mut Vec<u8>, field: u32, value: f64) {
    field_key(out, field, 1);
    out.extend_from_slice(&value.to_le_bytes());
}

fn bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    field_key(out, field, 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use sentry_protos::snuba::v1::any_value::Value as Any;
    use sentry_protos::snuba::v1::{TraceItem, TraceItemType};

    #[test]
    fn an_item_decodes_with_the_sentry_protos_bindings_field_for_field() {
        let mut attributes = Vec::new();
        attribute(&mut attributes, "category", Value::Str("ui.click"));
        attribute(&mut attributes, "is_dead", Value::Bool(false));
        attribute(&mut attributes, "node_id", Value::Int(-3));
        attribute(&mut attributes, "duration", Value::Double(0.25));
        attribute(&mut attributes, "empty", Value::Str(""));
        let header = Header {
            organization_id: 1,
            project_id: 300,
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736",
            item_id: [7; 16],
            timestamp: Timestamp::from_millis(1_796_012_448_123),
            retention_days: 90,
            received: Timestamp::from_millis(1_796_012_450_000),
        };
        let mut bytes = Vec::new();
        item(&mut bytes, &header, &[&attributes]);
        let decoded = TraceItem::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded.organization_id, 1);
        assert_eq!(decoded.project_id, 300);
        assert_eq!(decoded.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(decoded.item_id, vec![7; 16]);
        assert_eq!(decoded.item_type, TraceItemType::Replay as i32);
        let ts = decoded.timestamp.unwrap();
        assert_eq!((ts.seconds, ts.nanos), (1_796_012_448, 123_000_000));
        assert_eq!(decoded.received.unwrap().seconds, 1_796_012_450);
        assert_eq!(
            (decoded.client_sample_rate, decoded.server_sample_rate),
            (1.0, 1.0)
        );
        assert_eq!(decoded.retention_days, 90);
        let value = |k: &str| decoded.attributes[k].value.clone().unwrap();
        assert_eq!(value("category"), Any::StringValue("ui.click".into()));
        assert_eq!(value("is_dead"), Any::BoolValue(false));
        assert_eq!(value("node_id"), Any::IntValue(-3));
        assert_eq!(value("duration"), Any::DoubleValue(0.25));
        assert_eq!(value("empty"), Any::StringValue(String::new()));
        assert_eq!(decoded.attributes.len(), 5);
    }

    #[test]
    fn varint_lengths_match_what_is_written() {
        for value in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut out = Vec::new();
            varint(&mut out, value);
            assert_eq!(varint_len(value), out.len(), "{value}");
        }
    }

    #[test]
    fn timestamps_before_the_epoch_floor_to_the_second_below() {
        assert_eq!(
            Timestamp::from_millis(-1),
            Timestamp {
                seconds: -1,
                nanos: 999_000_000
            }
        );
        let mut bytes = Vec::new();
        let header = Header {
            organization_id: 1,
            project_id: 1,
            trace_id: "t",
            item_id: [0; 16],
            timestamp: Timestamp::from_millis(-1500),
            retention_days: 30,
            received: Timestamp::from_millis(0),
        };
        item(&mut bytes, &header, &[]);
        let decoded = TraceItem::decode(bytes.as_slice()).unwrap();
        let ts = decoded.timestamp.unwrap();
        assert_eq!((ts.seconds, ts.nanos), (-2, 500_000_000));
    }
}
