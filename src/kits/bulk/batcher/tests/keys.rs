//! The document key: its bytes, its equality and its hash.

use super::*;
use bytes::Bytes;

/// A key is its bytes: `as_bytes` gives back exactly what it was made of, and an
/// owned copy is the same key.
#[test]
fn a_key_gives_back_its_bytes() {
    let buffer = Bytes::from_static(b"xx\"_index\":\"i\",\"_id\":\"d\"yy");
    let k = DocKey::new(buffer.slice(2..buffer.len() - 2));
    assert_eq!(k.as_bytes(), b"\"_index\":\"i\",\"_id\":\"d\"");
    assert_eq!(DocKey::from("d").as_bytes(), b"d");
    assert_eq!(DocKey::from(String::from("e")).as_bytes(), b"e");
    let owned = k.clone().owned();
    assert_eq!(owned.as_bytes(), k.as_bytes());
    assert_eq!(owned, k);
}

/// The stored hash only rules keys out: two keys whose hashes collide are equal
/// exactly when their bytes are, whether they share a buffer (a key and its prefix,
/// the same slice) or not.
#[test]
fn keys_whose_hashes_collide_are_told_apart_by_their_bytes() {
    let forged = |bytes: Bytes| DocKey { hash: 7, bytes };
    let buffer = Bytes::from_static(b"abcdabcd");
    let (whole, prefix) = (forged(buffer.clone()), forged(buffer.slice(0..4)));
    assert_ne!(whole, prefix, "same start, different lengths");
    assert_ne!(prefix, whole);
    assert_ne!(
        forged(buffer.slice(0..4)),
        forged(buffer.slice(1..5)),
        "same length, different bytes"
    );
    assert_eq!(
        forged(buffer.slice(0..4)),
        forged(buffer.slice(4..8)),
        "the same bytes at two places"
    );
    assert_eq!(forged(buffer.slice(0..4)), prefix, "the same slice");
    assert_ne!(
        forged(Bytes::from_static(b"abcd")),
        forged(Bytes::from_static(b"abce"))
    );
    // Equal bytes with different hashes cannot come from `new`; keys made by it are
    // equal exactly when their bytes are.
    assert_eq!(DocKey::from("abcd"), DocKey::new(buffer.slice(4..8)));
    assert_ne!(DocKey::from("abcd"), DocKey::from("abce"));
}

/// The map hashes a key by its stored hash, so distinct documents spread over the
/// map rather than all landing in one bucket chain.
#[test]
fn distinct_keys_hash_apart_and_equal_keys_alike() {
    use std::hash::BuildHasher as _;
    let state = std::collections::hash_map::RandomState::new();
    let hashes: std::collections::HashSet<u64> = (0..1000)
        .map(|i| state.hash_one(DocKey::from(format!("doc-{i}"))))
        .collect();
    assert_eq!(hashes.len(), 1000);
    let buffer = Bytes::from_static(b"doc-1doc-1");
    assert_eq!(
        state.hash_one(DocKey::new(buffer.slice(0..5))),
        state.hash_one(DocKey::new(buffer.slice(5..10)))
    );
}
