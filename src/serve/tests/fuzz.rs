//! The stable fuzz harness: a bounded number of generated inputs through
//! `serve::fuzzing::exercise` (what the cargo-fuzz target runs), each within a time bound.
//! Inputs: arbitrary bytes, mutated encodings of the samples, structured hostile shapes (deep
//! nesting, huge counts), and the same as YAML/JSON text.

use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;

use crate::graph::tests::wire_bytes::nested_template_bytes;
use crate::serve::fuzzing::exercise;

/// Time one input may take: generous for a debug build on a shared 2-core machine, and still
/// far below what a quadratic or exponential path takes on these inputs (minutes).
const PER_INPUT: Duration = Duration::from_secs(30);

fn timed(data: &[u8]) {
    let start = Instant::now();
    exercise(data);
    assert!(
        start.elapsed() < PER_INPUT,
        "{:?} for {} bytes",
        start.elapsed(),
        data.len()
    );
}

fn samples() -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/graphs");
    ["sequence", "ensemble", "switch-canary"]
        .iter()
        .flat_map(|name| ["pb", "yaml"].map(|ext| dir.join(format!("{name}.{ext}"))))
        .filter_map(|path| std::fs::read(path).ok())
        .collect()
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
    Repeat(usize, usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, bits)| Mutation::Flip(at, bits)),
        (any::<usize>(), vec(any::<u8>(), 1..8)).prop_map(|(at, b)| Mutation::Insert(at, b)),
        (any::<usize>(), 1usize..16).prop_map(|(at, n)| Mutation::Remove(at, n)),
        (any::<usize>(), 1usize..32, 1usize..500)
            .prop_map(|(at, n, times)| Mutation::Repeat(at, n, times)),
    ]
}

fn apply(mut data: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        if data.is_empty() {
            break;
        }
        let len = data.len();
        match m {
            Mutation::Flip(at, bits) => data[at % len] ^= bits,
            Mutation::Insert(at, bytes) => {
                let at = at % len;
                data.splice(at..at, bytes.iter().copied());
            }
            Mutation::Remove(at, n) => {
                let at = at % len;
                let end = (at + n).min(len);
                data.drain(at..end);
            }
            Mutation::Repeat(at, n, times) => {
                let at = at % len;
                let end = (at + n).min(len);
                let piece = data[at..end].to_vec();
                let repeated = piece.repeat(*times);
                data.splice(end..end, repeated);
            }
        }
    }
    data
}

/// Hostile shapes, built directly: nested length-delimited fields, repeated entries, deep text.
fn hostile() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // Nested JsonValue/JsonList inside a node's input_template, any depth.
        (1usize..400).prop_map(|depth| nested_template_bytes("m", depth)),
        // Many repeated top-level entries of one field.
        (
            prop_oneof![Just(0x32u8), Just(0x3a), Just(0x4a), Just(0x52)],
            1usize..50_000
        )
            .prop_map(|(tag, n)| [tag, 0x00].repeat(n)),
        // Deep text of mixed brackets and quotes.
        (
            vec(
                prop_oneof![
                    Just("["),
                    Just("{a: "),
                    Just("'"),
                    Just("\""),
                    Just("#"),
                    Just("\n"),
                    Just("- "),
                    Just("|\n")
                ],
                1..64
            ),
            1usize..3000
        )
            .prop_map(|(pieces, times)| pieces.concat().repeat(times).into_bytes()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes(data in vec(any::<u8>(), 0..2048)) {
        timed(&data);
    }

    #[test]
    fn mutated_samples(which in any::<prop::sample::Index>(), mutations in vec(mutation(), 1..6)) {
        let samples = samples();
        prop_assume!(!samples.is_empty());
        let data = apply(which.get(&samples).clone(), &mutations);
        timed(&data);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn hostile_shapes(data in hostile()) {
        timed(&data);
    }
}
