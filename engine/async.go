package engine

import "context"

// AsyncAppender is implemented by a Topic that can take a record and
// report its outcome later, so that a publisher keeps many records in
// flight (pubsub's PublishAsync). It is optional: without it the typed
// layer appends each asynchronous record with AppendOne, before
// PublishAsync returns (the in-memory engine, whose append is immediate).
//
// AppendAsync admits rec to the end of partition, or refuses it: it
// returns an error only when the record was not admitted ([ErrClosed] once
// Close began, [ErrInvalid] for a record the engine cannot store, ctx's
// error when it ended while the engine waited to admit it), and then
// nothing is stored and done is never called. Otherwise the record and
// its bytes belong to the engine, ctx no longer matters, and done is
// called exactly once with the record's offset, or with the error that
// kept it out of the log (offset then -1):
//
//   - in append order per partition: the done of a record is called
//     after the done of every record appended to its partition before it,
//     and records of a partition are stored in that order, never
//     reordered by the engine's retries;
//   - from a goroutine of the engine's, never from AppendAsync itself
//     and never under a lock the caller holds, so done may take the
//     caller's locks; it may run before AppendAsync returns. A slow done
//     delays the outcomes of the records behind it;
//   - when a record fails, the records of its partition appended before
//     its failure was reported and not yet stored fail too, their errors
//     wrapping ErrAborted and the first one's (which carries its own
//     cause, not ErrAborted), but not ErrOutcomeUnknown, which would say
//     they may be stored. A record whose fate the engine cannot tell
//     fails with an error wrapping ErrOutcomeUnknown instead. An engine
//     that can always keep a partition's stored records a prefix of what
//     was appended declares GaplessAsync;
//   - within a bound the engine documents, so that no record waits
//     forever, also when Close ends the engine: Close resolves what is
//     left.
//
// AppendAsync must not wait for the server's confirmation. It is safe for
// concurrent use: the records of a partition are appended in the order
// their AppendAsync calls admitted them (the typed layer makes the calls
// of one partition one at a time, in the order of its callers).
type AsyncAppender interface {
	AppendAsync(ctx context.Context, partition int, rec *Record, done func(offset int64, err error)) error
}
