//! Server-sent events for `stream: true`: a task drives a [`Generation`] and turns its updates
//! into `data: {json}` chunks through the route's formatter, then `data: [DONE]`.
//!
//! Invariants: a client that disconnects (the SSE body is dropped) ends the task at once, even
//! while no token arrives (paused server), which drops the generation and so cancels its
//! sequences in the batcher; a generation error is sent as one `data: {"error": ...}` chunk
//! before `[DONE]`, never as a broken connection.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::ApiError;
use crate::generation::{Generation, Update};

/// Where in the stream a formatter is called.
#[derive(Debug)]
pub enum Phase {
    /// Before any update (chat sends each choice's role here).
    Start,
    Update(Update),
    /// After the last update (usage goes here).
    End,
}

/// The chunks a formatter produces, and per-choice state it keeps between calls: the char
/// offset of the next token (for `text_offset`) and how many tokens' weight versions were sent
/// (a token whose chunk is skipped, having no text yet, sends its version with the next chunk,
/// so every token's version arrives).
#[derive(Debug, Default)]
pub struct Out {
    chunks: Vec<Value>,
    offsets: Vec<usize>,
    versions_sent: Vec<usize>,
}

impl Out {
    pub fn push(&mut self, chunk: Value) {
        self.chunks.push(chunk);
    }

    pub fn offset(&self, choice: usize) -> usize {
        self.offsets.get(choice).copied().unwrap_or(0)
    }

    /// The weight versions of choice `choice`'s tokens not sent yet, up to `through` tokens,
    /// marked as sent.
    pub fn versions(&mut self, choice: usize, all: &[u64], through: usize) -> Vec<u64> {
        if choice >= self.versions_sent.len() {
            self.versions_sent.resize(choice + 1, 0);
        }
        let from = self.versions_sent[choice].min(through);
        self.versions_sent[choice] = through.max(from);
        all[from..through.min(all.len())].to_vec()
    }

    pub fn set_offset(&mut self, choice: usize, offset: usize) {
        if choice >= self.offsets.len() {
            self.offsets.resize(choice + 1, 0);
        }
        self.offsets[choice] = offset;
    }
}

/// The SSE response of a generation.
#[derive(Debug)]
pub struct EventStream;

impl EventStream {
    pub fn spawn<F>(mut generation: Generation, mut format: F) -> Response
    where
        F: FnMut(&mut Generation, Phase, &mut Out) -> Result<(), ApiError> + Send + 'static,
    {
        let (sender, receiver) = tokio::sync::mpsc::channel::<Event>(256);
        tokio::spawn(async move {
            let mut out = Out::default();
            let mut phase = Some(Phase::Start);
            loop {
                let result = match phase.take() {
                    Some(phase) => format(&mut generation, phase, &mut out),
                    None => {
                        let next = tokio::select! {
                            _ = sender.closed() => return,
                            next = generation.next() => next,
                        };
                        match next {
                            Ok(Some(update)) => {
                                format(&mut generation, Phase::Update(update), &mut out)
                            }
                            Ok(None) => {
                                let result = format(&mut generation, Phase::End, &mut out);
                                if send_chunks(&sender, &mut out).await.is_err() {
                                    return;
                                }
                                if let Err(error) = result {
                                    let _ = send(&sender, error.body().to_string()).await;
                                }
                                break;
                            }
                            Err(error) => Err(error),
                        }
                    }
                };
                if send_chunks(&sender, &mut out).await.is_err() {
                    return;
                }
                if let Err(error) = result {
                    let _ = send(&sender, error.body().to_string()).await;
                    break;
                }
            }
            let _ = send(&sender, "[DONE]".to_string()).await;
        });
        let events = ReceiverStream::new(receiver).map(Ok::<Event, Infallible>);
        Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response()
    }
}

async fn send(sender: &tokio::sync::mpsc::Sender<Event>, data: String) -> Result<(), ()> {
    sender
        .send(Event::default().data(data))
        .await
        .map_err(|_| ())
}

async fn send_chunks(sender: &tokio::sync::mpsc::Sender<Event>, out: &mut Out) -> Result<(), ()> {
    for chunk in std::mem::take(&mut out.chunks) {
        send(sender, chunk.to_string()).await?;
    }
    Ok(())
}

/// A response id: `prefix-` and 32 random hex digits.
pub fn request_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}
