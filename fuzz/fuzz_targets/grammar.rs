//! Scripts built from vigil's grammar (tests/statement_gen.rs): each input
//! byte picks the next choice, so most inputs reach the planner. An input
//! that starts with `;` is taken as SQL text after the declarations
//! instead, so the seed corpus (statements from tests/cases) is mutated as
//! text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vigil_fuzz::statement_gen::{PRELUDE, script};

fuzz_target!(|data: &[u8]| {
    let sql = match data.split_first() {
        Some((b';', rest)) => format!("{PRELUDE}{}", vigil_fuzz::text(rest)),
        _ => script(data),
    };
    vigil_fuzz::check_script(&sql, &vigil_fuzz::base_dir());
});
