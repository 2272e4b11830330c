//! Kafka error codes the protocol client and the recovery interpret (from the protocol guide).

/// Success.
pub(crate) const NONE: i16 = 0;
/// The request timed out (for EndTxn: the transaction-log append may still have been written).
pub(crate) const REQUEST_TIMED_OUT: i16 = 7;
/// The connection to another broker failed while handling the request.
pub(crate) const NETWORK_EXCEPTION: i16 = 13;
/// The coordinator is still loading its state.
pub(crate) const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
/// The coordinator is not available (for EndTxn also: its transaction-log append failed or timed
/// out, and may still have been written).
pub(crate) const COORDINATOR_NOT_AVAILABLE: i16 = 15;
/// This broker is not the coordinator (any more: for EndTxn it may have lost the role while
/// appending to the transaction log).
pub(crate) const NOT_COORDINATOR: i16 = 16;
/// The transaction is between states (markers being written): try again.
pub(crate) const CONCURRENT_TRANSACTIONS: i16 = 51;
/// The coordinator does not know the id: it never existed, or it expired after
/// `transactional.id.expiration.ms` without a transaction.
pub(crate) const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;

/// The coordinator moved, or is still loading its state: find it again and retry.
pub(crate) fn coordinator_moving(c: i16) -> bool {
    matches!(
        c,
        COORDINATOR_LOAD_IN_PROGRESS | COORDINATOR_NOT_AVAILABLE | NOT_COORDINATOR
    )
}

/// Worth retrying after finding the coordinator again (an EndTxn only after describing the
/// transaction: it may have been applied).
pub(crate) fn retriable(c: i16) -> bool {
    matches!(
        c,
        REQUEST_TIMED_OUT
            | NETWORK_EXCEPTION
            | COORDINATOR_LOAD_IN_PROGRESS
            | COORDINATOR_NOT_AVAILABLE
            | NOT_COORDINATOR
            | CONCURRENT_TRANSACTIONS
    )
}
