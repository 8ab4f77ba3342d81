//! The Flight messages of one remote subscriber's stream, made from the topic's frames:
//! batches encoded again ([`Encoder`]) or relayed as the producer encoded them
//! ([`Relay`]), and the protocol's control messages.

use std::collections::VecDeque;
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow_flight::FlightData;
use arrow_ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions};
use bytes::Bytes;
use sluice_core::wire::{self, MessageParts};
use sluice_core::{Result, SluiceError, TopicName};
use sluice_shm::{Frame, SamplePayload, TopicSubscriber};
use tonic::Status;

use crate::meta::Meta;
use crate::outbox::{Outbox, Outgoing};
use crate::status::status;

/// A metadata-only Flight message: the protocol's metadata, and no IPC message.
fn control(meta: Meta) -> FlightData {
    // No IPC message at all, as Arrow C++ and Java write a message of metadata alone
    // (pyarrow's reader yields it as a chunk without data); Sluice's client gives it the
    // header arrow-rs's decoder needs (`client::metadata_only`).
    FlightData {
        app_metadata: meta.encode(),
        ..FlightData::default()
    }
}

/// How a frame leaves the stream.
#[derive(PartialEq, Eq)]
pub(crate) enum Next {
    Go,
    End,
}

/// The Flight messages of one stream, kept from frame to frame.
#[derive(Default)]
pub(crate) struct Messages {
    pub(crate) encoder: Encoder,
    relay: Relay,
    /// Messages not yet handed to gRPC, in order.
    pub(crate) pending: VecDeque<Outgoing>,
}

impl Messages {
    /// Queues `frame`'s messages; `borrow`: messages may point into its sample.
    pub(crate) fn queue(
        &mut self,
        frame: Frame,
        topic: &TopicName,
        borrow: bool,
        outbox: &mut Outbox,
    ) -> std::result::Result<Next, Status> {
        match frame {
            Frame::Batch {
                epoch,
                index,
                batch_rows,
                batch,
                ..
            } => self
                .encoder
                .messages(
                    &batch,
                    Meta::Batch {
                        epoch,
                        index,
                        batch_rows,
                    },
                    &mut self.pending,
                )
                .map_err(status)?,
            Frame::Encoded {
                epoch,
                index,
                batch_rows,
                rows,
                payload,
            } => self
                .relay
                .messages(
                    payload,
                    borrow.then_some(outbox),
                    rows,
                    Meta::Batch {
                        epoch,
                        index,
                        batch_rows,
                    },
                    &mut self.pending,
                )
                .map_err(status)?,
            Frame::DeviceBatch { .. } => {
                return Err(Status::failed_precondition(format!(
                    "topic '{topic}' keeps its batches in GPU memory, which cannot be sent \
                     to another machine: run the plan with sluice.device = 'cpu' or \
                     'cuda_host:N' for remote subscribers"
                )));
            }
            Frame::EndOfEpoch {
                epoch,
                batches,
                rows,
            } => self.control(Meta::EndOfEpoch {
                epoch,
                batches,
                rows,
            }),
            Frame::Missed { messages } => self.control(Meta::Missed { messages }),
            Frame::EndOfStream => {
                self.control(Meta::EndOfStream { epochs: 0 });
                return Ok(Next::End);
            }
        }
        Ok(Next::Go)
    }

    pub(crate) fn control(&mut self, meta: Meta) {
        self.pending.push_back(Outgoing::Owned(control(meta)));
    }

    /// Queues, copied, what is left in the queue of `sub`, whose producer is gone; the
    /// end of the stream if it was there (`Ok`) or an error.
    pub(crate) fn take_rest(
        &mut self,
        sub: &mut TopicSubscriber,
        topic: &TopicName,
        outbox: &mut Outbox,
    ) -> Option<std::result::Result<(), Status>> {
        loop {
            match sub.recv(Some(Duration::ZERO)) {
                Ok(frame) => match self.queue(frame, topic, false, outbox) {
                    Ok(Next::Go) => {}
                    Ok(Next::End) => return Some(Ok(())),
                    Err(e) => return Some(Err(e)),
                },
                // Nothing left.
                Err(SluiceError::Timeout { .. } | SluiceError::ProducerLost(_)) => return None,
                Err(e) => return Some(Err(status(e))),
            }
        }
    }
}

/// Encodes one stream's batches as Flight messages: the schema when it is new, each
/// batch's dictionaries with it.
#[derive(Default)]
pub(crate) struct Encoder {
    schema: Option<SchemaRef>,
    /// Dictionary ids the schema takes (numbered 0, 1, … as its encoding met them).
    dictionaries: usize,
    generator: IpcDataGenerator,
    context: IpcWriteContext,
    options: IpcWriteOptions,
}

impl Encoder {
    /// `batch` as Flight messages, appended to `messages` (the schema when new,
    /// dictionaries, the batch with `meta`).
    pub(crate) fn messages(
        &mut self,
        batch: &RecordBatch,
        meta: Meta,
        messages: &mut VecDeque<Outgoing>,
    ) -> Result<()> {
        if self.schema.as_ref() != Some(batch.schema_ref()) {
            // Encoding the schema numbers its dictionaries.
            let mut tracker = DictionaryTracker::new(false);
            let schema = self.generator.schema_to_bytes_with_dictionary_tracker(
                batch.schema_ref(),
                &mut tracker,
                &self.options,
            );
            self.dictionaries = tracker.dict_id().len();
            messages.push_back(Outgoing::Owned(FlightData::from(schema)));
            self.schema = Some(batch.schema());
        }
        // A tracker of this batch alone, with the schema's ids (0, 1, …, as numbered
        // above): one kept from batch to batch keeps the dictionaries it saw, and those
        // point into their shared-memory samples (the subscriber decodes in place), which
        // would hold a dead producer's topic for the whole stream. So every batch's
        // dictionaries are sent, as the producer's own messages carry them.
        let mut tracker = DictionaryTracker::new(false);
        for _ in 0..self.dictionaries {
            tracker.next_dict_id();
        }
        let (dictionaries, encoded) =
            self.generator
                .encode(batch, &mut tracker, &self.options, &mut self.context)?;
        messages.extend(
            dictionaries
                .into_iter()
                .map(|d| Outgoing::Owned(FlightData::from(d))),
        );
        let mut data = FlightData::from(encoded);
        data.app_metadata = meta.encode();
        messages.push_back(Outgoing::Owned(data));
        Ok(())
    }
}

/// Forwards one stream's batches to a client as the producer encoded them: each of a
/// message's IPC messages becomes a Flight message of the same bytes, and the schema
/// message is sent when it differs from the one sent before. The bytes stay in shared
/// memory, the sample lent ([`Loan`]) until gRPC has encoded the messages (its one
/// copy), while the server's subscriber can hold one more sample
/// ([`TopicSubscriber::max_held`]); beyond that they are copied out and the sample goes
/// back at once.
///
/// The columns were validated by the server's subscriber ([`BatchForm::EncodedValidated`])
/// unless the client said it validates what it decodes ([`BatchForm::EncodedUnchecked`]:
/// Sluice's client, whose arrow-rs reader does; Arrow C++'s reader assumes valid data,
/// so a pyarrow client is sent only validated batches). The framing and the flatbuffers
/// are checked either way ([`wire::split`]), so what goes out is a well-formed message
/// sequence.
#[derive(Default)]
struct Relay {
    /// The metadata of the schema message sent last.
    schema: Option<Vec<u8>>,
}

impl Relay {
    /// The message in `payload` (a record batch of `rows` rows) as Flight messages,
    /// appended to `messages`: the schema when new, dictionaries, the batch with `meta`;
    /// pointing into the sample, lent through `lend`, with it, copied out of it without.
    fn messages(
        &mut self,
        payload: SamplePayload,
        lend: Option<&mut Outbox>,
        rows: u64,
        meta: Meta,
        messages: &mut VecDeque<Outgoing>,
    ) -> Result<()> {
        let (whole, loan) = match lend {
            Some(outbox) => {
                let whole = Bytes::from_owner(payload);
                let loan = outbox.lend(whole.clone());
                (whole, Some(loan))
            }
            None => (Bytes::copy_from_slice(payload.bytes()), None),
        };
        let split = wire::split(&whole)?;
        if split.rows != rows {
            return Err(SluiceError::Corrupt(format!(
                "batch has {} rows but its header says {rows}",
                split.rows
            )));
        }
        // `split`'s parts are slices of `whole`.
        let range = |part: &[u8]| {
            let start = (part.as_ptr() as usize).saturating_sub(whole.as_ptr() as usize);
            start..start + part.len()
        };
        let data = |parts: &MessageParts<'_>, app_metadata: Bytes| match &loan {
            Some(loan) => Outgoing::Lent {
                loan: loan.clone(),
                header: range(parts.metadata),
                body: range(parts.body),
                app_metadata,
            },
            None => Outgoing::Owned(FlightData {
                data_header: whole.slice_ref(parts.metadata),
                data_body: whole.slice_ref(parts.body),
                app_metadata,
                ..FlightData::default()
            }),
        };
        if self.schema.as_deref() != Some(split.schema.metadata) {
            messages.push_back(data(&split.schema, Bytes::new()));
            self.schema = Some(split.schema.metadata.to_vec());
        }
        messages.extend(
            split
                .dictionaries
                .iter()
                .map(|parts| data(parts, Bytes::new())),
        );
        messages.push_back(data(&split.batch, meta.encode()));
        Ok(())
    }
}
