//! Any bytes: protobuf decode, validation, rendering and the text forms must never panic (nor
//! hang, nor blow the stack). The checks live in `raypipe::graph::fuzzing::exercise`, which the
//! stable proptest harness (`cargo test --lib graph::tests::fuzz`) drives as well.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    raypipe::graph::fuzzing::exercise(data);
});
