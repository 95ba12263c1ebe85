//! What the operator tools need of a blob store beyond writing: listing by prefix, reading and
//! deleting objects (`replay-ingest delete`, `sweep`, `redrive`). Both stores implement it: GCS
//! through its JSON API (`gcs_json`), the filesystem store on its directory.

use futures::future::BoxFuture;

use super::SinkError;

/// One stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    pub key: String,
    pub size: u64,
    /// When it was last written, Unix seconds.
    pub updated: i64,
}

/// A listing one level deep: the objects right under a prefix, and the "directories" below it
/// (each ending in `/`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    pub objects: Vec<StoredObject>,
    pub prefixes: Vec<String>,
}

pub trait BlobStore: Send + Sync {
    /// Objects and sub-prefixes directly under `prefix` (which ends in `/`, or is empty for the
    /// top), in key order.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Listing, SinkError>>;

    /// The object's bytes; `None` when there is none.
    fn read<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, SinkError>>;

    /// Deletes the object; `false` when it was already gone (so a second run is a no-op).
    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, SinkError>>;

    /// Where `key` is, as an operator would write it.
    fn location(&self, key: &str) -> String;

    /// What the store keeps of an object it deleted, as an operator should read it, when it
    /// keeps anything: a delete is not final until then.
    fn kept_after_delete(&self) -> BoxFuture<'_, Result<Option<String>, SinkError>> {
        Box::pin(async { Ok(None) })
    }
}

/// Every object under `prefix`, however deep, listing one level at a time.
pub async fn walk(store: &dyn BlobStore, prefix: &str) -> Result<Vec<StoredObject>, SinkError> {
    let (mut found, mut pending) = (Vec::new(), vec![prefix.to_owned()]);
    while let Some(prefix) = pending.pop() {
        let listing = store.list(&prefix).await?;
        found.extend(listing.objects);
        pending.extend(listing.prefixes.into_iter().rev());
    }
    Ok(found)
}
