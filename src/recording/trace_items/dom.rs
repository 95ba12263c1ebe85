//! A custom event's data as a JSON value borrowed from the segment's text, for building its trace
//! item. Sentry reads the event as a Python dict; the builder needs a general value too (a
//! header's value or a method may be anything), but `serde_json::Value` allocated a string for
//! every text and a tree of nodes for every object, and freed them all again: most of what the
//! items cost (docs/outputs.md). Here a text without escapes is a slice of the segment and an
//! object is one vector of its entries.
//!
//! It reads as `serde_json::Value` does: of repeated keys the last wins, and an object's entries
//! go in key order (as `serde_json::Map` keeps them), which is where headers are taken from and
//! how a container prints.

use std::borrow::Cow;
use std::fmt;

use std::cell::Cell;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Number;

/// A JSON value; texts and keys borrow from the input unless they hold escapes.
#[derive(Debug, Clone, PartialEq)]
pub enum Json<'a> {
    Null,
    Bool(bool),
    Number(Number),
    Str(Cow<'a, str>),
    Array(Vec<Json<'a>>),
    Object(Object<'a>),
}

/// An object's entries as read, repeated keys included.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Object<'a>(Vec<(Cow<'a, str>, Json<'a>)>);

impl<'a> Json<'a> {
    /// The value of `key` when this is an object that has it.
    pub fn get(&self, key: &str) -> Option<&Json<'a>> {
        self.as_object().and_then(|o| o.get(key))
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&Object<'a>> {
        match self {
            Json::Object(o) => Some(o),
            _ => None,
        }
    }
}

impl<'a> Object<'a> {
    /// The value of `key`: the last one, when the key is repeated.
    pub fn get(&self, key: &str) -> Option<&Json<'a>> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Whether it has no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Its entries in key order, each key once with its last value.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Json<'a>)> {
        let mut sorted: Vec<(&str, &Json<'a>)> = self.0.iter().map(|(k, v)| (&**k, v)).collect();
        // Stable: of equal keys the one read last comes last.
        sorted.sort_by(|a, b| a.0.cmp(b.0));
        let mut kept: Vec<(&str, &Json<'a>)> = Vec::with_capacity(sorted.len());
        for entry in sorted {
            match kept.last_mut() {
                Some(last) if last.0 == entry.0 => *last = entry,
                _ => kept.push(entry),
            }
        }
        kept.into_iter()
    }
}

/// Why [`parse`] read no value.
#[derive(Debug, PartialEq, Eq)]
pub enum Unread {
    /// Not JSON as `serde_json::Value` reads it.
    Invalid,
    /// More values than the cap.
    TooMany,
}

/// The most heap one value read takes: an object's entry, its key beside it (an array's element,
/// the value alone, takes less).
pub const BYTES_PER_VALUE: usize = std::mem::size_of::<(Cow<'static, str>, Json<'static>)>();

/// `text` as a value of at most `max_values` values (containers and what they hold alike). Each
/// takes up to [`BYTES_PER_VALUE`] bytes — 28 times the two bytes of a `0,` in the text — so the
/// cap, not the text's length, bounds the tree (a million zeros in a console breadcrumb took
/// more than 60 MB).
pub fn parse(text: &str, max_values: usize) -> Result<Json<'_>, Unread> {
    let left = Cell::new(max_values);
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = Counted(&left, std::marker::PhantomData)
        .deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value));
    match value {
        Ok(value) => Ok(value),
        Err(_) if left.get() == EXHAUSTED => Err(Unread::TooMany),
        Err(_) => Err(Unread::Invalid),
    }
}

/// What a lone surrogate escape is read as by [`without_lone_surrogates`]: a noncharacter no
/// SDK sends, so that an attribute holding one can be told.
pub const LONE_SURROGATE: &str = "\u{ffff}";

/// `text` with each lone surrogate escape — `\ud83d` without its low half after it, or a low
/// half alone — written `\uffff` ([`LONE_SURROGATE`]), or `None` when it holds none. Python's
/// `json.loads` reads them (an SDK cutting a captured body can split an emoji, which
/// `JSON.stringify` writes so); serde_json refuses them, and the whole event with them.
pub fn without_lone_surrogates(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let unit = |at: usize| {
        let hex = bytes.get(at..at + 4)?;
        u16::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
    };
    let low_after = |at: usize| {
        bytes.get(at..at + 2) == Some(b"\\u")
            && unit(at + 2).is_some_and(|u| (0xDC00..0xE000).contains(&u))
    };
    let (mut out, mut copied, mut at) = (None::<String>, 0, 0);
    while let Some(found) = bytes.get(at..).and_then(|rest| memchr::memchr(b'\\', rest)) {
        at += found;
        let lone = match (bytes.get(at + 1), unit(at + 2)) {
            (Some(b'u'), Some(0xD800..0xDC00)) if low_after(at + 6) => {
                at += 12;
                continue;
            }
            (Some(b'u'), Some(0xD800..0xE000)) => true,
            (Some(b'u'), Some(_)) => false,
            // Any other escape: the backslash and the character it escapes.
            _ => {
                at += 2;
                continue;
            }
        };
        if lone {
            let out = out.get_or_insert_with(|| String::with_capacity(text.len()));
            out.push_str(text.get(copied..at)?);
            out.push_str("\\uffff");
            copied = at + 6;
        }
        at += 6;
    }
    let mut out = out?;
    out.push_str(text.get(copied..)?);
    Some(out)
}

/// What the count reads once the cap was passed.
const EXHAUSTED: usize = usize::MAX;

/// Reads one value, counting it and all it holds against what is left.
struct Counted<'c, 'a>(&'c Cell<usize>, std::marker::PhantomData<&'a ()>);

impl<'c, 'a> Counted<'c, 'a> {
    fn count<E: de::Error>(&self) -> Result<(), E> {
        match self.0.get() {
            0 | EXHAUSTED => {
                self.0.set(EXHAUSTED);
                Err(E::custom("too many values"))
            }
            left => {
                self.0.set(left - 1);
                Ok(())
            }
        }
    }

    fn next(&self) -> Counted<'c, 'a> {
        Counted(self.0, std::marker::PhantomData)
    }
}

impl<'de: 'a, 'a> DeserializeSeed<'de> for Counted<'_, 'a> {
    type Value = Json<'a>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Json<'a>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de: 'a, 'a> Visitor<'de> for Counted<'_, 'a> {
    type Value = Json<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Json<'a>, E> {
        self.count()?;
        Ok(Json::Bool(b))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Json<'a>, E> {
        self.count()?;
        Ok(Json::Number(n.into()))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Json<'a>, E> {
        self.count()?;
        Ok(Json::Number(n.into()))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Json<'a>, E> {
        self.count()?;
        Ok(Number::from_f64(n).map_or(Json::Null, Json::Number))
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Json<'a>, E> {
        self.count()?;
        Ok(Json::Str(Cow::Borrowed(s)))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Json<'a>, E> {
        self.count()?;
        Ok(Json::Str(Cow::Owned(s.to_owned())))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Json<'a>, E> {
        self.count()?;
        Ok(Json::Str(Cow::Owned(s)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Json<'a>, E> {
        self.count()?;
        Ok(Json::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Json<'a>, E> {
        self.count()?;
        Ok(Json::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Json<'a>, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json<'a>, A::Error> {
        self.count()?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self.next())? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json<'a>, A::Error> {
        self.count()?;
        let mut entries = Vec::new();
        while let Some(Key(key)) = map.next_key()? {
            entries.push((key, map.next_value_seed(self.next())?));
        }
        Ok(Json::Object(Object(entries)))
    }
}

/// An object's key, borrowed unless it holds escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Key<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for KeyVisitor<'a> {
            type Value = Key<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'a>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key<'a>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Key<'a>, E> {
                Ok(Key(Cow::Owned(s)))
            }
        }
        deserializer.deserialize_str(KeyVisitor(std::marker::PhantomData))
    }
}

/// As `serde_json::Value` writes itself: an object's entries in key order.
impl Serialize for Json<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => serializer.serialize_unit(),
            Json::Bool(b) => serializer.serialize_bool(*b),
            Json::Number(n) => n.serialize(serializer),
            Json::Str(s) => serializer.serialize_str(s),
            Json::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Json::Object(object) => {
                let mut map = serializer.serialize_map(None)?;
                for (key, value) in object.entries() {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// JSON texts with what a general value meets: escapes, repeated keys, numbers of every kind.
    fn json_text() -> impl Strategy<Value = String> {
        let key = prop::sample::select(vec!["a", "b", "h", "\\u0061", "a\\n", "é", ""]);
        let leaf = prop_oneof![
            Just("null".to_owned()),
            any::<bool>().prop_map(|b| b.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| format!("{f:e}")),
            Just("-0.0".to_owned()),
            "[a-z\\\\\"/ é\u{1F600}]{0,8}"
                .prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
            Just(r#""\ud83d\ude00\t\u0000""#.to_owned()),
        ];
        leaf.prop_recursive(4, 40, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                prop::collection::vec((key.clone(), inner), 0..6).prop_map(|entries| {
                    let entries: Vec<String> = entries
                        .into_iter()
                        .map(|(k, v)| format!("\"{k}\" : {v}"))
                        .collect();
                    format!("{{{}}}", entries.join(","))
                }),
            ]
        })
    }

    proptest! {
        /// Read, looked up and written as `serde_json::Value` reads, looks up and writes it.
        #[test]
        fn it_reads_and_writes_as_serde_json_value_does(text in json_text()) {
            let (value, json) = match (
                serde_json::from_str::<serde_json::Value>(&text),
                read(&text),
            ) {
                (Ok(value), Ok(json)) => (value, json),
                (value, json) => {
                    prop_assert_eq!(value.is_ok(), json.is_ok(), "{}", text);
                    return Ok(());
                }
            };
            prop_assert_eq!(serde_json::to_string(&json).unwrap(), value.to_string());
            for key in ["a", "b", "h", "a\n", "é", ""] {
                prop_assert_eq!(
                    json.get(key).map(|v| serde_json::to_string(v).unwrap()),
                    value.get(key).map(|v| v.to_string())
                );
            }
            let keys = |o: &Object| o.entries().map(|(k, _)| k.to_owned()).collect::<Vec<_>>();
            prop_assert_eq!(
                json.as_object().map(keys),
                value.as_object().map(|o| o.keys().cloned().collect())
            );
        }
    }

    #[test]
    fn texts_without_escapes_borrow_from_the_input() {
        let json = read(r#"{"plain":"text","esc\u0061ped":"a\nb"}"#).unwrap();
        let Json::Object(Object(entries)) = &json else {
            panic!("{json:?}")
        };
        assert!(matches!(
            &entries[0],
            (Cow::Borrowed("plain"), Json::Str(Cow::Borrowed("text")))
        ));
        assert!(
            matches!(&entries[1], (Cow::Owned(k), Json::Str(Cow::Owned(v))) if k == "escaped" && v == "a\nb")
        );
    }

    #[test]
    fn what_serde_json_refuses_it_refuses() {
        for text in [
            r#"{"a":1,}"#,
            "[1 2]",
            r#"{"a" 1}"#,
            "\"\\x\"",
            "01",
            "[1]]",
            "1e400",
        ] {
            assert_eq!(read(text).err(), Some(Unread::Invalid), "{text}");
        }
    }

    /// Without a cap to speak of.
    fn read(text: &str) -> Result<Json<'_>, Unread> {
        parse(text, 1 << 40)
    }

    #[test]
    fn lone_surrogates_are_marked_and_pairs_and_other_escapes_kept() {
        let cases = [
            (r#"{"a":"x\ud83d"}"#, Some(r#"{"a":"x\uffff"}"#)),
            (
                r#"["\ude00\ud83d\ude00\ud83d"]"#,
                Some(r#"["\uffff\ud83d\ude00\uffff"]"#),
            ),
            (r#"["\ud83d\u0041"]"#, Some(r#"["\uffff\u0041"]"#)),
            (r#"["\\ud83d", "\ud83d\ude00", "\n\u00e9"]"#, None),
            (r#""\ud83""#, None),
        ];
        for (text, marked) in cases {
            let got = without_lone_surrogates(text);
            assert_eq!(got.as_deref(), marked, "{text}");
            if let Some(marked) = marked {
                assert!(read(text).is_err() && read(marked).is_ok(), "{text}");
            }
        }
        let Ok(Json::Object(object)) = read(r#"{"a":"x\uffff"}"#) else {
            panic!()
        };
        let a = object.get("a").and_then(Json::as_str);
        assert_eq!(a, Some(format!("x{LONE_SURROGATE}").as_str()));
    }

    #[test]
    fn past_the_cap_nothing_is_read_and_it_says_so() {
        let text = r#"{"a":[1,2,{"b":null}],"c":"d"}"#;
        // The object, the array, 1, 2, the inner object, null, "d".
        assert_eq!(parse(text, 7), read(text));
        assert_eq!(parse(text, 6).err(), Some(Unread::TooMany));
        assert_eq!(
            parse("[1,", 1).err(),
            Some(Unread::TooMany),
            "the cap first"
        );
        assert_eq!(parse("[1,", 5).err(), Some(Unread::Invalid));
        assert_eq!(parse("", 5).err(), Some(Unread::Invalid));
    }
}
