//! Preprocessing functions for plan files: images, text, tensors.
//!
//! Every function here is a DataFusion scalar UDF, registered in each plan's
//! `SessionContext` by [`register`], so a plan file can say
//!
//! ```sql
//! SELECT id,
//!        to_chw(normalize(random_flip(random_crop(decode_image(jpeg), 224, 224, id), id),
//!                         make_array(0.485, 0.456, 0.406), make_array(0.229, 0.224, 0.225))) AS pixels,
//!        one_hot(label, 10) AS target
//! FROM train;
//! ```
//!
//! # Representation
//!
//! * A decoded image has a size of its own, so `decode_image` returns an
//!   *image struct*: `struct<data: large_binary, height: uint32, width: uint32,
//!   channels: uint8>` with the pixels in `data`, row-major HWC `uint8`. The channel count
//!   is fixed per call (`decode_image(bytes, 3)`), and recorded in the field metadata
//!   `sluice.image.channels` so later functions know the output shape at plan time.
//! * Once `resize`, `center_crop` or `random_crop` have fixed the size, images are
//!   tensors: Arrow's canonical `arrow.fixed_shape_tensor` extension type, a
//!   `FixedSizeList<T>` (non-nullable items) whose field metadata carries the shape
//!   (`{"shape":[224,224,3]}`). pyarrow, numpy (through Sluice's DLPack) and torch see the
//!   shape.
//!
//! # Randomness
//!
//! `random_crop` and `random_flip` take a row key (any integer or string column) and draw
//! from `SplitMix64(epoch_seed(seed, epoch) ^ hash(function, key))`, where `seed` is the
//! plan's `sluice.shuffle_seed` (0 when unset) and `epoch` the epoch being executed. The
//! pair reaches the functions through a config extension ([`FunctionContext`], prefix
//! `sluice_functions`) that [`crate::Plan::execute_epoch`] sets on the session state it
//! plans each epoch with; DataFusion hands it to every UDF call in
//! `ScalarFunctionArgs::config_options`. The same (seed, epoch, key) always gives the same
//! crop, in any partition, in any run; another epoch gives another one.
//!
//! # Errors and nulls
//!
//! A null input gives a null output. A bad row (bytes that are not an image, an image
//! smaller than its crop, a label out of range) fails the query with an error that names
//! the function and the row; `try_decode_image` turns undecodable rows into nulls instead.
//!
//! # Speed
//!
//! Each function works on a whole Arrow array: it computes the output size, allocates
//! one output buffer per batch and writes into it. Scratch space (resampling weights,
//! intermediate rows) is reused across the rows of a batch. DataFusion runs partitions
//! in parallel.

mod common;
mod image;
pub mod jpeg;
mod sample_cut;
mod selection;
mod tensor;
mod text;

use std::any::Any;

use datafusion::common::DataFusionError;
use datafusion::common::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use datafusion::prelude::SessionContext;

pub use common::{IMAGE_CHANNELS_KEY, tensor_field, tensor_shape};

/// The (seed, epoch) pair that random functions draw from, set by the plan per epoch,
/// and the round that the selection functions draw from.
///
/// Not settable from a plan file: `sluice.shuffle_seed` is the seed, and the epoch is
/// the one being executed.
///
/// Written out rather than with DataFusion's `extensions_options!`, whose entries are
/// named without the prefix (`seed`): a Ballista job carries its options as those
/// entries and sets them on the executor by name, so the names must be the full
/// `sluice_functions.seed` and `sluice_functions.epoch`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FunctionContext {
    /// The plan's seed (`sluice.shuffle_seed`, 0 when unset).
    pub seed: u64,
    /// The epoch being executed.
    pub epoch: u64,
    /// The round the plan was made for (`sluice.rounds`), which the selection functions
    /// draw from.
    pub round: u64,
}

impl ConfigExtension for FunctionContext {
    const PREFIX: &'static str = "sluice_functions";
}

impl ExtensionOptions for FunctionContext {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> datafusion::common::Result<()> {
        // Accept the key with or without the prefix: `ConfigOptions::set` strips it.
        let key = key
            .strip_prefix(Self::PREFIX)
            .and_then(|k| k.strip_prefix('.'))
            .unwrap_or(key);
        let parsed = value.trim().parse::<u64>().map_err(|e| {
            DataFusionError::Configuration(format!(
                "{}.{key}: '{value}' is not an unsigned integer ({e})",
                Self::PREFIX
            ))
        });
        match key {
            "seed" => self.seed = parsed?,
            "epoch" => self.epoch = parsed?,
            "round" => self.round = parsed?,
            other => {
                return Err(DataFusionError::Configuration(format!(
                    "unknown option {}.{other}; the options are seed, epoch and round",
                    Self::PREFIX
                )));
            }
        }
        Ok(())
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        vec![
            ConfigEntry {
                key: format!("{}.seed", Self::PREFIX),
                value: Some(self.seed.to_string()),
                description: "The plan's seed (sluice.shuffle_seed, 0 when unset).",
            },
            ConfigEntry {
                key: format!("{}.epoch", Self::PREFIX),
                value: Some(self.epoch.to_string()),
                description: "The epoch being executed.",
            },
            ConfigEntry {
                key: format!("{}.round", Self::PREFIX),
                value: Some(self.round.to_string()),
                description: "The round the plan was made for.",
            },
        ]
    }
}

/// Every preprocessing function, as fresh instances (a tokenizer cache per plan).
pub fn all() -> Vec<ScalarUDF> {
    let mut out = image::udfs();
    out.extend(tensor::udfs());
    out.push(text::udf());
    out.extend(selection::udfs());
    out
}

/// Every aggregate function Sluice adds (`sample_cut`).
pub fn aggregates() -> Vec<AggregateUDF> {
    vec![sample_cut::udaf()]
}

/// Registers every preprocessing function in `ctx`.
pub fn register(ctx: &SessionContext) {
    for udf in all() {
        ctx.register_udf(udf);
    }
    for udaf in aggregates() {
        ctx.register_udaf(udaf);
    }
}

/// The names of the preprocessing functions, the aggregates last.
pub fn names() -> Vec<String> {
    let scalar = all().into_iter().map(|f| f.name().to_string());
    scalar
        .chain(aggregates().iter().map(|f| f.name().to_string()))
        .collect()
}

#[cfg(test)]
mod tests;
