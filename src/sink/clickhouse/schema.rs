//! The `replays` table: its columns, how each is encoded on the wire, its DDL for the server's
//! version, and the check that a table found matches the rows.

use crate::recording::ReplayRow;

/// A server version, e.g. `18.16.1` → (18, 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServerVersion(pub u32, pub u32);

impl ServerVersion {
    pub fn parse(version: &str) -> Option<Self> {
        let mut parts = version.trim().split('.').map(|p| p.parse::<u32>().ok());
        Some(ServerVersion(parts.next()??, parts.next()??))
    }
}

/// What the server can do, probed at migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerFeatures {
    pub version: ServerVersion,
    /// `cityHash64` accepts a `UUID` (18.16 does not: it hashes `toString(replay_id)` there).
    pub hash_uuid: bool,
}

impl ServerFeatures {
    /// Table TTL arrived in 19.6.
    pub fn supports_ttl(self) -> bool {
        self.version >= ServerVersion(19, 6)
    }

    /// `LowCardinality` without an experimental setting, the IP domain types and bloom-filter
    /// indexes without one: 20.1 and later (snuba's own note puts the indexes there).
    pub fn supports_snuba_schema(self) -> bool {
        self.version >= ServerVersion(20, 1)
    }
}

/// One column of snuba's `replays_local`: name, type on a current server, and its DEFAULT or
/// MATERIALIZED clause (empty when none).
pub struct Column {
    pub name: &'static str,
    pub kind: &'static str,
    pub extra: &'static str,
}

const fn column(name: &'static str, kind: &'static str) -> Column {
    Column {
        name,
        kind,
        extra: "",
    }
}

const fn derived(name: &'static str, kind: &'static str, extra: &'static str) -> Column {
    Column { name, kind, extra }
}

/// `replays_local` as snuba's 25 migrations leave it, in table order. The columns `ReplayRow`
/// writes are a subsequence; the rest (`url`, materialized counts and hashes) the server fills.
pub const TABLE: [Column; 78] = [
    column("replay_id", "UUID"),
    column("debug_id", "UUID"),
    derived(
        "count_info_events",
        "UInt8",
        "MATERIALIZED (debug_id != '00000000-0000-0000-0000-000000000000') + (info_id != '00000000-0000-0000-0000-000000000000')",
    ),
    derived(
        "count_warning_events",
        "UInt8",
        "MATERIALIZED warning_id != '00000000-0000-0000-0000-000000000000'",
    ),
    derived(
        "count_error_events",
        "UInt8",
        "MATERIALIZED (error_id != '00000000-0000-0000-0000-000000000000') + (fatal_id != '00000000-0000-0000-0000-000000000000')",
    ),
    column("info_id", "UUID"),
    column("warning_id", "UUID"),
    column("error_id", "UUID"),
    column("fatal_id", "UUID"),
    column("replay_type", "LowCardinality(Nullable(String))"),
    column("error_sample_rate", "Nullable(Float64)"),
    column("session_sample_rate", "Nullable(Float64)"),
    column("event_hash", "UUID"),
    column("segment_id", "Nullable(UInt16)"),
    column("trace_ids", "Array(UUID)"),
    derived(
        "_trace_ids_hashed",
        "Array(UInt64)",
        "MATERIALIZED arrayMap(t -> cityHash64(t), trace_ids)",
    ),
    column("title", "Nullable(String)"),
    column("url", "Nullable(String)"),
    column("urls", "Array(String)"),
    column("segment_names", "Array(String)"),
    column("is_archived", "Nullable(UInt8)"),
    column("error_ids", "Array(UUID)"),
    derived(
        "_error_ids_hashed",
        "Array(UInt64)",
        "MATERIALIZED arrayMap(t -> cityHash64(t), error_ids)",
    ),
    column("project_id", "UInt64"),
    column("timestamp", "DateTime"),
    column("replay_start_timestamp", "Nullable(DateTime)"),
    column("platform", "LowCardinality(String)"),
    column("environment", "LowCardinality(Nullable(String))"),
    column("release", "Nullable(String)"),
    column("dist", "Nullable(String)"),
    column("ip_address_v4", "Nullable(IPv4)"),
    column("ip_address_v6", "Nullable(IPv6)"),
    column("user", "Nullable(String)"),
    column("user_id", "Nullable(String)"),
    column("user_name", "Nullable(String)"),
    column("user_email", "Nullable(String)"),
    column("user_geo_city", "String"),
    column("user_geo_country_code", "String"),
    column("user_geo_region", "String"),
    column("user_geo_subdivision", "String"),
    column("viewed_by_id", "UInt64"),
    column("os_name", "LowCardinality(Nullable(String))"),
    column("os_version", "Nullable(String)"),
    column("browser_name", "LowCardinality(Nullable(String))"),
    column("browser_version", "Nullable(String)"),
    column("device_name", "LowCardinality(Nullable(String))"),
    column("device_brand", "LowCardinality(Nullable(String))"),
    column("device_family", "LowCardinality(Nullable(String))"),
    column("device_model", "LowCardinality(Nullable(String))"),
    column("ota_updates_channel", "String"),
    column("ota_updates_runtime_version", "String"),
    column("ota_updates_update_id", "String"),
    column("sdk_name", "LowCardinality(Nullable(String))"),
    column("sdk_version", "LowCardinality(Nullable(String))"),
    column("tags.key", "Array(String)"),
    column("tags.value", "Array(String)"),
    derived(
        "_tags_hash_map",
        "Array(UInt64)",
        r"MATERIALIZED arrayMap((k, v) -> cityHash64(concat(replaceRegexpAll(k, '(\\=|\\\\)', '\\\\\\1'), '=', v)), `tags.key`, `tags.value`)",
    ),
    derived("click_node_id", "UInt32", "DEFAULT 0"),
    derived("click_tag", "LowCardinality(String)", "DEFAULT ''"),
    derived("click_id", "String", "DEFAULT ''"),
    column("click_class", "Array(String)"),
    derived("click_text", "String", "DEFAULT ''"),
    derived("click_role", "LowCardinality(String)", "DEFAULT ''"),
    derived("click_alt", "String", "DEFAULT ''"),
    derived("click_testid", "String", "DEFAULT ''"),
    derived("click_aria_label", "String", "DEFAULT ''"),
    derived("click_title", "String", "DEFAULT ''"),
    column("click_component_name", "String"),
    column("click_is_dead", "UInt8"),
    column("click_is_rage", "UInt8"),
    column("tap_message", "String"),
    column("tap_view_class", "String"),
    column("tap_view_id", "String"),
    derived("count_errors", "UInt16", "MATERIALIZED length(error_ids)"),
    derived("count_urls", "UInt16", "MATERIALIZED length(urls)"),
    column("retention_days", "UInt16"),
    column("partition", "UInt16"),
    column("offset", "UInt64"),
];

/// snuba's data-skipping indexes (current servers only).
const INDEXES: [&str; 6] = [
    "INDEX bf_trace_ids_hashed _trace_ids_hashed TYPE bloom_filter() GRANULARITY 1",
    "INDEX bf_error_ids_hashed _error_ids_hashed TYPE bloom_filter() GRANULARITY 1",
    "INDEX bf_user_id user_id TYPE bloom_filter() GRANULARITY 1",
    "INDEX bf_user_email user_email TYPE bloom_filter() GRANULARITY 1",
    "INDEX bf_ip_address_v4 ip_address_v4 TYPE bloom_filter() GRANULARITY 1",
    "INDEX bf_tags_hash_map _tags_hash_map TYPE bloom_filter GRANULARITY 1",
];

/// A column type as RowBinary encodes it: `LowCardinality` changes nothing on the wire, `IPv4`
/// is a `UInt32` and `IPv6` a `FixedString(16)`. Older servers get these plainer types, and the
/// startup check compares types in this form, so a table snuba made and one `migrate` made on an
/// old server both pass.
pub fn wire_type(kind: &str) -> String {
    let mut kind = kind.to_owned();
    while let Some(start) = kind.find("LowCardinality(") {
        let inner = start + "LowCardinality(".len();
        let mut depth = 1;
        let end = kind[inner..]
            .char_indices()
            .find_map(|(i, c)| {
                depth += match c {
                    '(' => 1,
                    ')' => -1,
                    _ => 0,
                };
                (depth == 0).then_some(inner + i)
            })
            .unwrap_or(kind.len());
        kind = format!(
            "{}{}{}",
            &kind[..start],
            &kind[inner..end],
            kind.get(end + 1..).unwrap_or("")
        );
    }
    kind.replace("IPv4", "UInt32")
        .replace("IPv6", "FixedString(16)")
}

/// `CREATE TABLE` for `replays_local` on a server with `features`: snuba's final schema where
/// the server supports it; on an old one (18.16 here) the same columns in the same order with
/// the types RowBinary encodes identically (`wire_type`), no indexes and no TTL, and the UUID
/// hashes taken of the UUID's text.
pub fn create_table_sql(database: &str, table: &str, features: ServerFeatures) -> String {
    let modern = features.supports_snuba_schema();
    let mut lines: Vec<String> = TABLE
        .iter()
        .map(|c| {
            let kind = if modern {
                c.kind.to_owned()
            } else {
                wire_type(c.kind)
            };
            let extra = if features.hash_uuid {
                c.extra.to_owned()
            } else {
                c.extra.replace("cityHash64(t)", "cityHash64(toString(t))")
            };
            let space = if extra.is_empty() { "" } else { " " };
            format!("    `{}` {kind}{space}{extra}", c.name)
        })
        .collect();
    if modern {
        lines.extend(INDEXES.iter().map(|index| format!("    {index}")));
    }
    let replay_hash = if features.hash_uuid {
        "cityHash64(replay_id)"
    } else {
        "cityHash64(toString(replay_id))"
    };
    let ttl = if features.supports_ttl() {
        "\nTTL timestamp + toIntervalDay(retention_days)"
    } else {
        ""
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {database}.{table}\n(\n{}\n)\nENGINE = ReplacingMergeTree()\n\
         PARTITION BY (retention_days, toMonday(timestamp))\n\
         ORDER BY (project_id, toStartOfDay(timestamp), {replay_hash}, event_hash){ttl}\n\
         SETTINGS index_granularity = 8192",
        lines.join(",\n")
    )
}

/// Each column the rows write that is missing from `found` (name, type) or of a type encoded
/// differently, one phrase each.
pub(super) fn schema_problems(found: &[(String, String)]) -> Result<(), String> {
    let problems: Vec<String> = <ReplayRow as clickhouse::Row>::COLUMN_NAMES
        .iter()
        .filter_map(|&name| {
            let expected = TABLE
                .iter()
                .find(|c| c.name == name)
                .map(|c| wire_type(c.kind))
                .unwrap_or_default();
            match found.iter().find(|(n, _)| n == name) {
                None => Some(format!("column {name} is missing")),
                Some((_, actual)) if wire_type(actual) != expected => {
                    Some(format!("column {name} is {actual}, expected {expected}"))
                }
                Some(_) => None,
            }
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}
