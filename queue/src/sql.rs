//! What the two SQL engines share: the column lists their statements return, decoded by
//! position into the crate's values, and the fencing verdict of a refused update.

use bytes::Bytes;
use sqlx::{ColumnIndex, Database, Decode, Row, Type};

use crate::codec::decode_headers;
use crate::error::QueueError;
use crate::message::{from_millis, Attempt, DeliveryId, Leased, Message, State, Summary};

/// Columns of a leased message, in [`leased`]'s order; the statement appends the engine's
/// clock as a thirteenth column. Attempts and age count from the message's last entry into
/// the queue (`cycle_at`, `cycle_base`: set by a replay), so a replay starts a fresh schedule.
pub(crate) const LEASED_COLUMNS: &str = "id, token, attempt_count - cycle_base, leases, \
     enqueued_at, queue, tenant, method, path, headers, body, COALESCE(cycle_at, enqueued_at)";

/// Columns of a whole message, in [`message`]'s order.
pub(crate) const MESSAGE_COLUMNS: &str = "id, queue, tenant, state, method, path, headers, body, \
     dedupe_key, enqueued_at, due_at, updated_at, attempts, reason";

/// Columns of a listing row, in [`summary`]'s order (`seq` last, for the cursor).
pub(crate) const SUMMARY_COLUMNS: &str =
    "id, queue, tenant, state, enqueued_at, due_at, attempt_count, reason, seq";

fn get<'r, R, T>(row: &'r R, i: usize) -> Result<T, QueueError>
where
    R: Row,
    usize: ColumnIndex<R>,
    T: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(row.try_get(i)?)
}

/// A [`LEASED_COLUMNS`] row followed by the engine's clock at the lease (for the age).
pub(crate) fn leased<R, DB>(row: &R) -> Result<Leased, QueueError>
where
    DB: Database,
    R: Row<Database = DB>,
    usize: ColumnIndex<R>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Option<String>: Decode<'r, DB> + Type<DB>,
    for<'r> Vec<u8>: Decode<'r, DB> + Type<DB>,
{
    let enqueued_at_ms: i64 = get(row, 4)?;
    let cycle_at: i64 = get(row, 11)?;
    let now: i64 = get(row, 12)?;
    let headers: Vec<u8> = get(row, 9)?;
    let body: Vec<u8> = get(row, 10)?;
    Ok(Leased {
        id: DeliveryId::from_stored(get(row, 0)?),
        token: count(get(row, 1)?),
        attempts: u32::try_from(get::<_, i64>(row, 2)?).unwrap_or(u32::MAX),
        leases: u32::try_from(get::<_, i64>(row, 3)?).unwrap_or(u32::MAX),
        enqueued_at_ms,
        age: from_millis(now.saturating_sub(cycle_at)),
        queue: get(row, 5)?,
        tenant: get(row, 6)?,
        method: get(row, 7)?,
        path_and_query: get(row, 8)?,
        headers: decode_headers(&headers)?,
        body: Bytes::from(body),
    })
}

/// A [`MESSAGE_COLUMNS`] row.
pub(crate) fn message<R, DB>(row: &R) -> Result<Message, QueueError>
where
    DB: Database,
    R: Row<Database = DB>,
    usize: ColumnIndex<R>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Option<String>: Decode<'r, DB> + Type<DB>,
    for<'r> Vec<u8>: Decode<'r, DB> + Type<DB>,
{
    let headers: Vec<u8> = get(row, 6)?;
    let body: Vec<u8> = get(row, 7)?;
    let attempts: String = get(row, 12)?;
    Ok(Message {
        id: DeliveryId::from_stored(get(row, 0)?),
        queue: get(row, 1)?,
        tenant: get(row, 2)?,
        state: state(get(row, 3)?)?,
        method: get(row, 4)?,
        path_and_query: get(row, 5)?,
        headers: decode_headers(&headers)?,
        body: Bytes::from(body),
        dedupe_key: get(row, 8)?,
        enqueued_at_ms: get(row, 9)?,
        due_at_ms: get(row, 10)?,
        updated_at_ms: get(row, 11)?,
        attempts: attempts_from_json(&attempts)?,
        reason: get(row, 13)?,
    })
}

/// A [`SUMMARY_COLUMNS`] row and its `seq`.
pub(crate) fn summary<R, DB>(row: &R) -> Result<(Summary, i64), QueueError>
where
    DB: Database,
    R: Row<Database = DB>,
    usize: ColumnIndex<R>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Option<String>: Decode<'r, DB> + Type<DB>,
{
    Ok((
        Summary {
            id: DeliveryId::from_stored(get(row, 0)?),
            queue: get(row, 1)?,
            tenant: get(row, 2)?,
            state: state(get(row, 3)?)?,
            enqueued_at_ms: get(row, 4)?,
            due_at_ms: get(row, 5)?,
            attempts: u32::try_from(get::<_, i64>(row, 6)?).unwrap_or(u32::MAX),
            reason: get(row, 7)?,
        },
        get(row, 8)?,
    ))
}

pub(crate) fn state(code: i64) -> Result<State, QueueError> {
    State::from_code(code).ok_or_else(|| QueueError::Corrupt(format!("state {code}")))
}

pub(crate) fn attempts_from_json(json: &str) -> Result<Vec<Attempt>, QueueError> {
    serde_json::from_str(json).map_err(|e| QueueError::Corrupt(format!("attempt history: {e}")))
}

/// One attempt as the JSON the engines append to the history.
pub(crate) fn attempt_json(attempt: &Attempt) -> String {
    // Serializing plain integers and a string cannot fail; an empty object keeps the
    // history readable if it ever did.
    serde_json::to_string(attempt).unwrap_or_else(|_| "{}".to_owned())
}

/// A token or counter from a signed column.
pub(crate) fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// A token as the signed column stores it.
pub(crate) fn token_arg(token: u64) -> i64 {
    i64::try_from(token).unwrap_or(i64::MAX)
}

/// Lease column of [`refusal`]: the lease has ended.
pub(crate) const LEASE_EXPIRED: i64 = 2;

/// Why a guarded update touched no row, from the row as it is now: `(state, token, lease)`
/// with `lease` 0 (none), 1 (live) or [`LEASE_EXPIRED`], or `None` when the
/// message is gone.
pub(crate) fn refusal(id: &DeliveryId, presented: u64, now: Option<(i64, i64, i64)>) -> QueueError {
    match now {
        None => QueueError::NotFound(id.clone()),
        Some((code, token, lease))
            if code == State::Pending.code()
                && count(token) == presented
                && lease == LEASE_EXPIRED =>
        {
            QueueError::LeaseLost {
                id: id.clone(),
                presented,
            }
        }
        Some(_) => QueueError::Fenced {
            id: id.clone(),
            presented,
        },
    }
}

/// The cursor of a SQL listing: the last row's `seq`.
pub(crate) fn cursor_seq(cursor: Option<&crate::Cursor>) -> Result<i64, QueueError> {
    match cursor {
        None => Ok(0),
        Some(c) => {
            c.0.parse()
                .map_err(|_| QueueError::InvalidCursor(c.0.clone()))
        }
    }
}

/// A page from up to `size + 1` [`SUMMARY_COLUMNS`] rows: the extra row only says that
/// more follow.
pub(crate) fn page<R, DB>(rows: &[R], size: usize) -> Result<crate::Page, QueueError>
where
    DB: Database,
    R: Row<Database = DB>,
    usize: ColumnIndex<R>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Option<String>: Decode<'r, DB> + Type<DB>,
{
    let mut items = Vec::with_capacity(size.min(rows.len()));
    let mut last = 0;
    for row in rows.iter().take(size) {
        let (item, seq) = summary(row)?;
        items.push(item);
        last = seq;
    }
    let next = (rows.len() > size).then(|| crate::Cursor(last.to_string()));
    Ok(crate::Page { items, next })
}
