#![no_main]

libfuzzer_sys::fuzz_target!(init: sluice_fuzz::init(), |data: &[u8]| sluice_fuzz::jpeg(data));
