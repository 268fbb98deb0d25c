//! "Writing a sink" shows this sink whole, and its conformance test, as they are.

#[test]
fn the_guide_shows_the_whole_sink_as_it_is() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = std::fs::read_to_string(root.join("../../docs/writing-a-sink.md")).unwrap();
    let sink = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let shown = guide
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("the guide's first rust block");
    assert_eq!(
        shown,
        sink.trim_end(),
        "docs/writing-a-sink.md: the first rust block must be src/lib.rs"
    );
}

#[test]
fn the_guide_shows_the_conformance_test_as_it_is() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = std::fs::read_to_string(root.join("../../docs/writing-a-sink.md")).unwrap();
    let test = std::fs::read_to_string(root.join("tests/conformance.rs")).unwrap();
    let shown = guide
        .split("```rust\n")
        .skip(1)
        .filter_map(|block| block.split("\n```").next())
        .any(|block| block == test.trim_end());
    assert!(
        shown,
        "docs/writing-a-sink.md must show tests/conformance.rs whole, in a rust block"
    );
}
