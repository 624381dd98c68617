use super::*;

/// XXH3-64 (seed 0) of each id as computed by the xxHash project's own C
/// library (libxxhash 0.8.1, `XXH3_64bits`), then `mod 16` and `mod 100`:
/// the routing of every process and build must match these.
const VECTORS: &[(&[u8], u64, usize, usize)] = &[
    (b"", 0x2d06_8005_38d3_94c2, 2, 38),
    (b"a", 0xe6c6_32b6_1e96_4e1f, 15, 19),
    (b"buyer-1", 0xe9f4_7f82_0289_6e87, 7, 43),
    (b"buyer-1017", 0x1b6c_fb8f_268f_52fa, 10, 22),
    (b"user:42", 0x9fc1_e605_fa71_74aa, 10, 26),
    (b"12345", 0xf340_99ed_e96b_5581, 1, 81),
    (&42u64.to_be_bytes(), 0x2e4f_e982_b689_10ac, 12, 80),
];

/// Inputs of 100, 200 and 1000 bytes (`i % 251`): XXH3's mid-size and long
/// code paths, against the same C library.
const LONG_VECTORS: &[(usize, u64, usize, usize)] =
    &[(100, 0x004e_4f92_1a64_bd1c, 12, 16), (200, 0xf42a_8864_feaf_0703, 3, 31), (1000, 0x33ef_703f_b2b2_0ed1, 1, 29)];

#[test]
fn routing_matches_the_reference_vectors() {
    for &(id, hash, mod16, mod100) in VECTORS {
        assert_eq!(xxhash_rust::xxh3::xxh3_64(id), hash, "{id:?}");
        assert_eq!(route(id, 16), Some(mod16), "{id:?}");
        assert_eq!(route(id, 100), Some(mod100), "{id:?}");
    }
    for &(len, hash, mod16, mod100) in LONG_VECTORS {
        let id: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        assert_eq!(xxhash_rust::xxh3::xxh3_64(&id), hash, "{len} bytes");
        assert_eq!((route(&id, 16), route(&id, 100)), (Some(mod16), Some(mod100)), "{len} bytes");
    }
    assert_eq!(route("buyer-1017", 0), None);
    assert_eq!(route("buyer-1017", 1), Some(0));
    // &str, String, &[u8] and Vec<u8> of the same bytes route alike.
    assert_eq!(route("user:42", 100), route(String::from("user:42"), 100));
    let owned: Vec<u8> = b"user:42".into();
    assert_eq!(route(owned, 100), route(&b"user:42"[..], 100));
}

#[test]
fn routing_spreads_ids_evenly() {
    let mut counts = [0u32; 16];
    for i in 0..16_000 {
        counts[route(format!("buyer-{i}"), 16).expect("16 segments")] += 1;
    }
    // 1,000 expected per segment; a fair hash stays well within ±15%.
    assert!(counts.iter().all(|&c| (850..=1150).contains(&c)), "{counts:?}");
}

#[test]
fn segment_keys_are_named_key_slash_seg_index() {
    assert_eq!(segment_key("stock:42", 0), "stock:42/seg-0");
    assert_eq!(segment_key("stock:42", 99), "stock:42/seg-99");
}

async fn client() -> (tempfile::TempDir, Client) {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/seg.db", dir.path().display());
    (dir, Client::connect(&url).await.expect("connect"))
}

#[tokio::test]
async fn bad_input_is_a_typed_error() {
    let (_dir, client) = client().await;
    let invalid = |r: Result<Segmented>| match r {
        Err(Error::InvalidInput { what, .. }) => what,
        other => panic!("expected InvalidInput, got {other:?}"),
    };
    assert_eq!(invalid(client.segmented("k", 0)), "segments");
    assert_eq!(invalid(client.segmented("k", MAX_SEGMENTS + 1)), "segments");
    assert_eq!(invalid(client.segmented("", 4)), "key");
    assert_eq!(invalid(client.segmented("a\nb", 4)), "key");
    // 256 - "/seg-15".len() = 249 bytes fit with 16 segments, 250 do not.
    assert!(client.segmented("k".repeat(249), 16).is_ok());
    assert_eq!(invalid(client.segmented("k".repeat(250), 16)), "key");
    assert!(client.segmented("k".repeat(250), 10).is_ok(), "only the longest suffix counts");
    assert!(client.segmented("k", MAX_SEGMENTS).is_ok());

    let seg = client.segmented("k", 4).expect("valid");
    assert!(matches!(seg.mark_empty(4), Err(Error::InvalidInput { what: "segment", .. })));
    assert!(matches!(seg.restock(9), Err(Error::InvalidInput { what: "segment", .. })));
    assert!(matches!(seg.acquire_segment(4).await, Err(Error::InvalidInput { what: "segment", .. })));
    assert!(!seg.is_marked_empty(4));
    assert_eq!(seg.segment_key(4), None);
    assert!(matches!(seg.clone().ttl(Duration::ZERO).acquire("x").await, Err(Error::InvalidInput { what: "ttl", .. })));
}

#[tokio::test]
async fn marks_are_shared_by_clones_and_correctable() {
    let (_dir, client) = client().await;
    let seg = client.segmented("marks", 4).expect("valid");
    let clone = seg.clone();
    let other = client.segmented("marks", 4).expect("valid");
    seg.mark_empty(2).expect("in range");
    assert!(clone.is_marked_empty(2) && !other.is_marked_empty(2), "clones share marks, other handles do not");
    assert_eq!(clone.marked_empty(), [2]);
    clone.restock(2).expect("in range");
    assert!(seg.marked_empty().is_empty());
    for i in 0..4 {
        seg.mark_empty(i).expect("in range");
    }
    let none: std::result::Result<_, Error> = seg.acquire_available("x", |_| async { Ok(true) }).await;
    assert!(none.expect("no I/O").is_none(), "all marked: sold out without asking the store");
    seg.restock_all();
    let some = seg.acquire_available("x", |_| async { Ok::<_, Error>(true) }).await.expect("acquire");
    let guard = some.expect("restocked: granted");
    assert_eq!(guard.segment(), seg.route("x"));
    assert_eq!(guard.key(), format!("marks/seg-{}", guard.segment()));
    guard.release().await.expect("release");
}
