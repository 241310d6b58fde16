//! Arbitrary bytes as CSV rows pushed into a stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vigil::connectors::Format;

fuzz_target!(|data: &[u8]| {
    vigil_fuzz::decode(Format::Csv, data);
});
