//! Any bytes: protobuf decode, validation, rendering and the text forms must never panic (nor
//! hang, nor blow the stack). The checks live in `raypipe::serve::fuzzing::exercise`, which the
//! stable proptest harness (`cargo test --lib serve::tests::fuzz`) drives as well.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    raypipe::serve::fuzzing::exercise(data);
});
