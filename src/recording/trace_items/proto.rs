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

/// Appends one attribute (a `map<string, AnyValue>` entry of field 7) to `out`.
pub fn attribute(out: &mut Vec<u8>, key: &str, value: Value<'_>) {
    let mut any = Vec::with_capacity(16);
    match value {
        // Oneof members are written even when they hold their type's default.
        Value::Str(s) => bytes_field(&mut any, 1, s.as_bytes()),
        Value::Bool(b) => varint_field(&mut any, 2, u64::from(b)),
        Value::Int(i) => varint_field(&mut any, 3, i as u64),
        Value::Double(d) => double_field(&mut any, 4, d),
    }
    let mut entry = Vec::with_capacity(key.len() + any.len() + 4);
    bytes_field(&mut entry, 1, key.as_bytes());
    bytes_field(&mut entry, 2, &any);
    bytes_field(out, 7, &entry);
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

    fn encode(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16);
        if self.seconds != 0 {
            varint_field(&mut out, 1, self.seconds as u64);
        }
        if self.nanos != 0 {
            varint_field(&mut out, 2, i64::from(self.nanos) as u64);
        }
        out
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
    bytes_field(out, 6, &header.timestamp.encode());
    for part in attributes {
        out.extend_from_slice(part);
    }
    double_field(out, 8, 1.0);
    double_field(out, 9, 1.0);
    varint_field(out, 100, u64::from(header.retention_days));
    bytes_field(out, 101, &header.received.encode());
}

fn key(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire_type));
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
    key(out, field, 0);
    varint(out, value);
}

fn double_field(out: &mut Vec<u8>, field: u32, value: f64) {
    key(out, field, 1);
    out.extend_from_slice(&value.to_le_bytes());
}

fn bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    key(out, field, 2);
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
