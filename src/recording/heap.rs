//! Heap bytes held by a processed segment, counted exactly: what `--buffer-max-bytes` bounds.
//!
//! Every type reports the heap bytes it owns — a `String` or `Vec` its *capacity*, not its length;
//! a shared `Arc<str>` its allocation divided among its holders, so a URL that a hundred clicks
//! refer to is counted once. A test compares these numbers with a counting allocator.

use std::sync::Arc;

use uuid::Uuid;

pub trait HeapSize {
    /// Heap bytes owned by `self` (not counting `size_of::<Self>()`).
    fn heap_size(&self) -> usize;
}

macro_rules! no_heap {
    ($($t:ty),*) => { $(impl HeapSize for $t { fn heap_size(&self) -> usize { 0 } })* };
}
no_heap!(bool, u8, u16, u32, u64, usize, f64, Uuid);

impl HeapSize for String {
    fn heap_size(&self) -> usize {
        self.capacity()
    }
}

/// A short string is held inline (no heap); a longer one owns its capacity.
impl HeapSize for compact_str::CompactString {
    fn heap_size(&self) -> usize {
        if self.is_heap_allocated() {
            self.capacity()
        } else {
            0
        }
    }
}

impl HeapSize for Box<str> {
    fn heap_size(&self) -> usize {
        self.len()
    }
}

/// Borrowed text is static: nothing of it is on the heap.
impl HeapSize for std::borrow::Cow<'static, str> {
    fn heap_size(&self) -> usize {
        match self {
            std::borrow::Cow::Borrowed(_) => 0,
            std::borrow::Cow::Owned(owned) => owned.heap_size(),
        }
    }
}

impl HeapSize for bytes::Bytes {
    /// Exact for `Bytes` made from a boxed slice (as blobs are); one buffer, however many clones.
    fn heap_size(&self) -> usize {
        self.len()
    }
}

impl HeapSize for Arc<str> {
    /// This holder's share of the allocation (two reference counts and the text, word-aligned);
    /// rounded up, so the shares add up to at least the whole.
    fn heap_size(&self) -> usize {
        let word = std::mem::size_of::<usize>();
        let allocation = (2 * word + self.len()).next_multiple_of(word);
        allocation.div_ceil(Arc::strong_count(self))
    }
}

impl<T: HeapSize> HeapSize for Vec<T> {
    fn heap_size(&self) -> usize {
        self.capacity() * std::mem::size_of::<T>()
            + self.iter().map(HeapSize::heap_size).sum::<usize>()
    }
}

impl<T: HeapSize> HeapSize for Box<T> {
    fn heap_size(&self) -> usize {
        std::mem::size_of::<T>() + (**self).heap_size()
    }
}

impl<T: HeapSize> HeapSize for Option<T> {
    fn heap_size(&self) -> usize {
        self.as_ref().map_or(0, HeapSize::heap_size)
    }
}

impl<A: HeapSize, B: HeapSize> HeapSize for (A, B) {
    fn heap_size(&self) -> usize {
        self.0.heap_size() + self.1.heap_size()
    }
}

/// Implements [`HeapSize`] for a struct as the sum over the named fields. Every field that can
/// own heap memory must be listed; the allocator test catches one that is not.
macro_rules! heap_size {
    ($t:ty { $($field:ident),* $(,)? }) => {
        impl $crate::recording::heap::HeapSize for $t {
            fn heap_size(&self) -> usize {
                0 $(+ $crate::recording::heap::HeapSize::heap_size(&self.$field))*
            }
        }
    };
}
pub(crate) use heap_size;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_vectors_count_their_capacity() {
        let mut s = String::with_capacity(100);
        s.push('x');
        assert_eq!(s.heap_size(), 100);
        let v: Vec<String> = vec!["ab".to_owned(), "cde".to_owned()];
        assert_eq!(v.heap_size(), 2 * std::mem::size_of::<String>() + 5);
    }

    #[test]
    fn a_shared_string_is_counted_once_across_its_holders() {
        let url: Arc<str> = Arc::from("x".repeat(1000).as_str());
        let holders: Vec<Arc<str>> = (0..100).map(|_| url.clone()).collect();
        let shares: usize =
            holders.iter().map(HeapSize::heap_size).sum::<usize>() + url.heap_size();
        assert!((1016..1016 + 101).contains(&shares), "{shares}");
    }
}
