//! Lenient building blocks for reading SDK-produced JSON with serde_json.
//!
//! SDKs send fields with surprising types (a number where a string was expected, `null`
//! anywhere). These types accept *any* JSON value without failing, so a single odd field never
//! turns a whole event — let alone a whole segment — into an error.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// Any JSON value, kept only when it is a string; borrowed from the input when unescaped.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Text<'a>(pub Option<Cow<'a, str>>);

/// Any JSON value, kept only when it is a finite number.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Num(pub Option<f64>);

impl<'a> Text<'a> {
    pub fn as_str(&self) -> Option<&str> {
        self.0.as_deref()
    }
}

impl Num {
    /// The value as a non-negative integer, when it is one exactly.
    pub fn as_u64(self) -> Option<u64> {
        self.0
            .filter(|v| *v >= 0.0 && v.fract() == 0.0 && *v <= u64::MAX as f64)
            .map(|v| v as u64)
    }
}

/// A JSON document as received, checked once to be strict JSON (what a serde_json reader accepts),
/// so outputs can embed it without parsing it again.
#[derive(Debug, Clone)]
pub struct RawJson(Box<serde_json::value::RawValue>);

impl RawJson {
    /// `json` when it is strict UTF-8 JSON.
    pub fn parse(json: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(json).ok()?;
        serde_json::value::RawValue::from_string(text.to_owned())
            .ok()
            .map(RawJson)
    }

    pub fn get(&self) -> &serde_json::value::RawValue {
        &self.0
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl super::heap::HeapSize for RawJson {
    fn heap_size(&self) -> usize {
        self.0.get().len()
    }
}

/// Consumes any value; the visitor impls decide what each kind of value becomes.
struct Lenient<T>(std::marker::PhantomData<T>);

/// Visitor methods that consume a value of the named kinds and yield `Self::Value::default()`.
/// Kinds: `seq`, `map`, `str`, `numbers`, `bool`, `null` (`null` also unwraps `Some`).
macro_rules! default_for {
    ($($kind:ident),* $(,)?) => { $(default_for!(@ $kind);)* };
    (@seq) => {
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok(Default::default())
        }
    };
    (@map) => {
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
            Ok(Default::default())
        }
    };
    (@str) => {
        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
    };
    (@numbers) => {
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
    };
    (@bool) => {
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
    };
    (@null) => {
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    };
}
pub(crate) use default_for;

impl<'de> Visitor<'de> for Lenient<Text<'de>> {
    type Value = Text<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Text(Some(Cow::Borrowed(v))))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Text(Some(Cow::Owned(v.to_owned()))))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Text(Some(Cow::Owned(v))))
    }
    default_for!(numbers, bool, null, seq, map);
}

impl<'de> Visitor<'de> for Lenient<Num> {
    type Value = Num;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Num(Some(v as f64)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Num(Some(v as f64)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Num(Some(v).filter(|v| v.is_finite())))
    }
    default_for!(str, bool, null, seq, map);
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Lenient::<Text<'de>>(std::marker::PhantomData))
    }
}

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Lenient::<Num>(std::marker::PhantomData))
    }
}

/// Any JSON value, kept when it is a string or a non-negative integer (as its decimal digits):
/// an id that SDKs send either way (`user.id`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Id<'a>(pub Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for Id<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Lenient::<Id<'de>>(std::marker::PhantomData))
    }
}

impl<'de> Visitor<'de> for Lenient<Id<'de>> {
    type Value = Id<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Id(Some(Cow::Borrowed(v))))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Id(Some(Cow::Owned(v.to_owned()))))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Id(Some(Cow::Owned(v))))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Id(Some(Cow::Owned(v.to_string()))))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Id(u64::try_from(v).ok().map(|v| Cow::Owned(v.to_string()))))
    }
    default_for!(bool, null, seq, map);
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Id(None))
    }
}

/// For `#[serde(default, deserialize_with = "object")]` fields: a JSON object read as `T`, and
/// anything else `None`, as Python code that tests `isinstance(x, dict)` or calls `x.get` sees
/// it. A derived `T` alone would also take an array, its elements as the fields in order.
/// [`Object`] is the same with `T::default()` for anything else.
pub fn object<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    d.deserialize_any(Lenient::<Option<T>>(std::marker::PhantomData))
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Lenient<Option<T>> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Some)
    }
    default_for!(str, numbers, bool, null, seq);
}

/// Any JSON value: `true` only when it is JSON `true`.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Flag(pub bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Lenient::<Flag>(std::marker::PhantomData))
    }
}

impl<'de> Visitor<'de> for Lenient<Flag> {
    type Value = Flag;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Flag(v))
    }
    default_for!(str, numbers, null, seq, map);
}

/// Any JSON value as Python code that reads it with `.get(key, default)` sees it: whether it is
/// truthy, and the value when it is a string, a number or a boolean. `Absent` when the key is not
/// there.
#[derive(Debug, Default, Clone, PartialEq)]
pub enum Py<'a> {
    #[default]
    Absent,
    Str(Cow<'a, str>),
    Number(f64),
    Bool(bool),
    /// `null`, an array or an object.
    Other {
        truthy: bool,
    },
}

impl<'a> Py<'a> {
    /// Python's truthiness.
    pub fn truthy(&self) -> bool {
        match self {
            Py::Absent => false,
            Py::Str(s) => !s.is_empty(),
            Py::Number(n) => *n != 0.0,
            Py::Bool(b) => *b,
            Py::Other { truthy } => *truthy,
        }
    }

    /// Python's `self or other`.
    pub fn or<'s>(&'s self, other: &'s Py<'a>) -> &'s Py<'a> {
        if self.truthy() { self } else { other }
    }

    /// As Python compares `.get(key, 0)` with a number: absent is 0, a number is itself, a
    /// boolean 0 or 1; `None` where the comparison raises (a string, `null`, an array, an
    /// object).
    pub fn number_or_zero(&self) -> Option<f64> {
        match self {
            Py::Absent => Some(0.0),
            Py::Number(n) => Some(*n),
            Py::Bool(b) => Some(f64::from(u8::from(*b))),
            Py::Str(_) | Py::Other { .. } => None,
        }
    }

    /// The value as a non-negative integer, when it is a number that is one exactly.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Py::Number(n) => Num(Some(*n)).as_u64(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Py::Str(s) => Some(s),
            _ => None,
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Py<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Lenient::<Py<'de>>(std::marker::PhantomData))
    }
}

impl<'de> Visitor<'de> for Lenient<Py<'de>> {
    type Value = Py<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Py::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Py::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Py::Str(Cow::Owned(v)))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Py::Number(v as f64))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Py::Number(v as f64))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Py::Number(v))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Py::Bool(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Py::Other { truthy: false })
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Py::Other { truthy: false })
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut truthy = false;
        while seq.next_element::<de::IgnoredAny>()?.is_some() {
            truthy = true;
        }
        Ok(Py::Other { truthy })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut truthy = false;
        while map
            .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
            .is_some()
        {
            truthy = true;
        }
        Ok(Py::Other { truthy })
    }
}

/// Most strings a [`TextList`] keeps; the rest of the array is consumed and counted, not kept.
pub const MAX_TEXT_LIST: usize = 1000;

/// Any JSON value: the strings of an array (the first `MAX_TEXT_LIST`), or nothing; and how many
/// of its elements were not strings (each is one of its length, as Python counts it).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct TextList<'a>(pub Vec<Cow<'a, str>>, pub Skipped, pub u64);

/// Array elements consumed but not kept.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Skipped(pub u64);

impl<'de: 'a, 'a> Deserialize<'de> for TextList<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Lenient::<TextList<'de>>(std::marker::PhantomData))
    }
}

impl<'de> Visitor<'de> for Lenient<TextList<'de>> {
    type Value = TextList<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let (mut items, mut skipped, mut others) = (Vec::new(), 0, 0);
        while let Some(Text(item)) = seq.next_element::<Text<'de>>()? {
            match item {
                Some(item) if items.len() < MAX_TEXT_LIST => items.push(item),
                Some(_) => skipped += 1,
                None => others += 1,
            }
        }
        Ok(TextList(items, Skipped(skipped), others))
    }
    default_for!(str, numbers, bool, null, map);
}

/// An object parsed as `T`, or `T::default()` when the value is not an object. `T`'s own fields
/// should be lenient too, so that nothing inside can fail.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Object<T>(pub T);

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        object(d).map(|value| Object(value.unwrap_or_default()))
    }
}

/// Parses `raw` as `T`, or `None` when it does not fit (the caller counts a malformed event).
pub fn parse<'a, T: Deserialize<'a>>(raw: &'a str) -> Option<T> {
    serde_json::from_str(raw).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Probe<'a> {
        #[serde(borrow, default)]
        text: Text<'a>,
        #[serde(default)]
        num: Num,
    }

    fn probe(json: &str) -> (Option<String>, Option<f64>) {
        let p: Probe = serde_json::from_str(json).unwrap();
        (p.text.0.map(Cow::into_owned), p.num.0)
    }

    #[test]
    fn text_keeps_strings_and_ignores_every_other_type() {
        assert_eq!(probe(r#"{"text":"a\"b"}"#).0.as_deref(), Some("a\"b"));
        for other in [
            "1",
            "-1",
            "1.5",
            "true",
            "null",
            "[1,[2]]",
            r#"{"x":{"y":1}}"#,
        ] {
            assert_eq!(
                probe(&format!(r#"{{"text":{other},"num":2}}"#)),
                (None, Some(2.0)),
                "{other}"
            );
        }
    }

    #[test]
    fn num_keeps_numbers_and_ignores_every_other_type() {
        assert_eq!(probe(r#"{"num":1796012448.69}"#).1, Some(1_796_012_448.69));
        assert_eq!(probe(r#"{"num":-3}"#).1, Some(-3.0));
        for other in [r#""5""#, "true", "null", "[5]", r#"{"n":5}"#] {
            assert_eq!(
                probe(&format!(r#"{{"num":{other},"text":"t"}}"#)),
                (Some("t".into()), None),
                "{other}"
            );
        }
    }

    #[test]
    fn ids_are_strings_or_non_negative_integers_and_flags_only_true() {
        #[derive(serde::Deserialize)]
        struct Ids<'a> {
            #[serde(borrow)]
            id: Id<'a>,
            flag: Flag,
        }
        let read = |json: &str| {
            let ids: Ids = serde_json::from_str(json).unwrap();
            (ids.id.0.map(Cow::into_owned), ids.flag.0)
        };
        assert_eq!(
            read(r#"{"id":"u-1","flag":true}"#),
            (Some("u-1".into()), true)
        );
        assert_eq!(
            read(r#"{"id":18446744073709551615,"flag":1}"#),
            (Some("18446744073709551615".into()), false)
        );
        for other in ["-1", "1.5", "true", "null", "[1]", r#"{"a":1}"#] {
            assert_eq!(
                read(&format!(r#"{{"id":{other},"flag":"true"}}"#)),
                (None, false),
                "{other}"
            );
        }
    }

    #[test]
    fn integers_are_exact_only_when_whole_and_non_negative() {
        assert_eq!(Num(Some(7.0)).as_u64(), Some(7));
        assert_eq!(Num(Some(7.5)).as_u64(), None);
        assert_eq!(Num(Some(-1.0)).as_u64(), None);
    }
}
