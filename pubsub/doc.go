// Package pubsub is logbus's typed API: a Broker owns topics; a Topic[K, V]
// routes each record by its key to one of its partitions, bounded logs with
// dense offsets; a Group[V] of consumers reads a topic, each partition by
// one consumer at a time, acking by returning from its Handler[V] (or a
// BatchHandler[V] for a batch of consecutive messages, committed once).
//
// Guarantees, in short (the module's top-level documentation has them in
// full): records with equal keys reach each group in publish order; a
// group's offset is committed only after its handler acked, so delivery is
// at least once; failures are retried with backoff, then dead-lettered; a
// full partition blocks its producers (bounded by BlockTimeout and the
// context) or sheds its oldest record, and both are counted; Close drains
// before it stops. Every type is safe for concurrent use unless its
// documentation says otherwise.
package pubsub
