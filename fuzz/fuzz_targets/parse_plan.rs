//! Arbitrary bytes as a script, parsed and planned like `vigil check`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vigil_fuzz::check_script(&vigil_fuzz::text(data), &vigil_fuzz::base_dir());
});
