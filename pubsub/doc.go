// Package pubsub is logbus's API: a typed publish/subscribe queue with the
// semantics of a Kafka log. The overview, with the guarantees in full, is
// the documentation of package [github.com/logbus/logbus]; this one says
// what each piece is, and each rule is stated once, where it is decided.
//
// # Concepts
//
//   - A [Broker] owns topics, consumer groups and the goroutines that
//     deliver to them: [NewBroker] makes one, [Broker.Close] drains it and
//     stops it.
//   - A [Topic] is a named log of records with keys of type K and values of
//     type V, which its codecs turn into bytes. It is split into
//     partitions, bounded logs ([Retention]) whose records get consecutive
//     offsets. A record's encoded key picks its partition ([Partitioner]),
//     so records with equal keys keep their order. [Topic.Publish] returns
//     where the record landed ([Position]).
//   - A [Group] is a named set of consumers reading a topic: every group
//     sees every record, and inside a group each partition is read by one
//     consumer at a time, in offset order. A consumer is a [Handler], a
//     [BatchHandler] or a [Stream]. The group commits a record once its
//     consumer acked it, so delivery is at least once; a record that keeps
//     failing is retried ([RetryPolicy]), then parked as a [DeadLetter].
//   - An [Engine] stores the records and delivers them: [InMemory] by
//     default.
//
// The overview's sections say what holds across all of them: [ordering],
// [delivery], [retries and dead letters], [backpressure], [shutdown] and
// [what is not promised]. Every type is safe for concurrent use unless its
// documentation says otherwise. Every error a call returns wraps one of the
// sentinel errors ([ErrClosed] and the others) or a context's error.
//
// [ordering]: https://pkg.go.dev/github.com/logbus/logbus#hdr-Ordering
// [delivery]: https://pkg.go.dev/github.com/logbus/logbus#hdr-Delivery
// [retries and dead letters]: https://pkg.go.dev/github.com/logbus/logbus#hdr-Retries_and_dead_letters
// [backpressure]: https://pkg.go.dev/github.com/logbus/logbus#hdr-Bounded_buffers_and_backpressure
// [shutdown]: https://pkg.go.dev/github.com/logbus/logbus#hdr-Shutdown
// [what is not promised]: https://pkg.go.dev/github.com/logbus/logbus#hdr-What_is_not_promised
package pubsub
