package main

import (
	"context"
	"fmt"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// logbusPeer runs logbus, the library under test, with a fresh broker per
// run so that no run inherits another's topics, groups or garbage.
//
// Mapping: one topic with sc.partitions partitions; sc.groups groups named
// g0..; each group has sc.consumers consumers (Subscribe with a HandlerFunc
// that returns nil, i.e. acks). S1/S2 publish keyless (PublishValue, spread
// round robin; with one partition that is just the partition). S3 publishes
// with one key per producer, each key chosen to hash to its own partition,
// so each producer owns one partition as with a Kafka key.
//
// json selects the "logbus-json" variant, S1 only: codec.JSON of a small
// struct carrying the 64 bytes, to show the JSON codec's cost beside the
// bytes codec's.
//
// batch > 1 selects the "logbus-batch" variant: the producers publish up to
// batch messages per call, PublishValues (S1, S2) or PublishBatch (S3).
//
// raw selects the "logbus-raw" variant: codec.RawBytes instead of
// codec.Bytes, so a handler reads the log's own bytes instead of a copy
// (the tracker reads them during the call, as RawBytes requires).
//
// consumer selects the "logbus-batch-consumer" variant: logbus-batch's
// producers, codec.RawBytes values, and each group's consumers subscribed
// with SubscribeBatch (batches of up to 64, no wait), so that both ends
// move a batch per call.
type logbusPeer struct {
	json     bool
	raw      bool
	batch    int
	consumer bool
}

func (p logbusPeer) name() string {
	switch {
	case p.consumer:
		return "logbus-batch-consumer"
	case p.json:
		return "logbus-json"
	case p.raw:
		return "logbus-raw"
	case p.batch > 1:
		return "logbus-batch"
	}
	return "logbus"
}

// logbus is at least once: a handler can see a message again after a
// failure or rebalance. Neither happens here, so duplicates would still be
// surprising, but they are reported rather than fatal.
func (logbusPeer) traits() traits { return traits{atLeastOnce: true} }

// jsonMsg is the logbus-json value: the 64-byte body travels base64-encoded
// in a JSON string, with the stamp and the sequence number as plain fields.
type jsonMsg struct {
	Seq  uint64 `json:"seq"`
	Sent int64  `json:"sent"`
	Body []byte `json:"body"`
}

// retention gives each partition room for 8192 records and makes a full
// partition block the producer (backpressure, as a channel does) rather
// than drop. The long timeout only guards against a hang: a producer never
// waits anywhere near that long.
var retention = pubsub.Retention{MaxMessages: 8192, OnFull: pubsub.Block, BlockTimeout: time.Minute}

func (p logbusPeer) run(sc scenario, n int) (result, error) {
	if p.json {
		if sc.name != "S1" {
			return result{}, errSkip
		}
		return runLogbus(sc, n, codec.JSON[jsonMsg](),
			func(seq uint64, stamp bool, body []byte) jsonMsg {
				m := jsonMsg{Seq: seq, Body: body}
				if stamp {
					m.Sent = time.Now().UnixNano()
				}
				return m
			},
			func(tr *tracker, g int, v jsonMsg) { tr.deliverSeq(g, v.Seq, v.Sent) })
	}
	if p.batch > 1 {
		return runLogbusBatches(sc, n, p.batch, p.consumer)
	}
	values := codec.Bytes()
	if p.raw {
		values = codec.RawBytes()
	}
	return runLogbus(sc, n, values,
		func(seq uint64, stamp bool, buf []byte) []byte {
			// The bytes codec copies on Encode, so the producer's
			// buffer can be reused for every message: no allocation
			// here that logbus itself does not make.
			fillPayload(buf, seq, stamp)
			return buf
		},
		func(tr *tracker, g int, v []byte) { tr.deliver(g, v) })
}

// runLogbus is one run for values of type V: build makes message seq from
// the producer's own 64-byte buffer, check hands a delivered value to the
// tracker.
func runLogbus[V any](sc scenario, n int, values codec.Codec[V],
	build func(seq uint64, stamp bool, buf []byte) V,
	check func(tr *tracker, g int, v V),
) (res result, err error) {
	bufs := make([][]byte, sc.producers)
	for p := range bufs {
		bufs[p] = make([]byte, payloadSize)
	}
	return withLogbus(sc, n, values, check, func(ctx context.Context, topic *pubsub.Topic[string, V], keys []string, stamp bool) error {
		return runProducers(sc, n, func(p int, seq uint64) error {
			v := build(seq, stamp, bufs[p])
			var err error
			if keys[p] == "" {
				_, err = topic.PublishValue(ctx, v)
			} else {
				_, err = topic.Publish(ctx, keys[p], v)
			}
			return err
		})
	})
}

// runLogbusBatches is runLogbus for logbus-batch: bytes values, published
// batch at a time.
func runLogbusBatches(sc scenario, n, batch int, consumer bool) (result, error) {
	check := func(tr *tracker, g int, v []byte) { tr.deliver(g, v) }
	values := codec.Bytes()
	if consumer {
		values = codec.RawBytes()
	}
	return withLogbusConsumers(sc, n, values, check, consumer, func(ctx context.Context, topic *pubsub.Topic[string, []byte], keys []string, stamp bool) error {
		// Each producer fills its own batch buffers; the bytes codec copies
		// on Encode, so they are reused for every batch.
		values := make([][][]byte, sc.producers)
		entries := make([][]pubsub.Entry[string, []byte], sc.producers)
		for p := range values {
			values[p] = make([][]byte, batch)
			entries[p] = make([]pubsub.Entry[string, []byte], batch)
			for i := range values[p] {
				values[p][i] = make([]byte, payloadSize)
				entries[p][i] = pubsub.Entry[string, []byte]{Key: keys[p], Value: values[p][i]}
			}
		}
		return runProducerBatches(sc, n, batch, func(p int, first uint64, count int) error {
			for i := range count {
				fillPayload(values[p][i], first+uint64(i), stamp)
			}
			var err error
			if keys[p] == "" {
				_, err = topic.PublishValues(ctx, values[p][:count])
			} else {
				_, err = topic.PublishBatch(ctx, entries[p][:count])
			}
			return err
		})
	})
}

// withLogbus is one logbus run: a fresh broker and topic, sc.groups groups
// whose handlers ack and hand each value to check, then publish (with one
// key per producer when there are several, keys[p], else keyless), then
// wait until every group has every message and its commits are done.
func withLogbus[V any](sc scenario, n int, values codec.Codec[V],
	check func(tr *tracker, g int, v V),
	publish func(ctx context.Context, topic *pubsub.Topic[string, V], keys []string, stamp bool) error,
) (res result, err error) {
	return withLogbusConsumers(sc, n, values, check, false, publish)
}

// withLogbusConsumers is withLogbus; batches subscribes the consumers
// with SubscribeBatch instead of Subscribe.
func withLogbusConsumers[V any](sc scenario, n int, values codec.Codec[V],
	check func(tr *tracker, g int, v V), batches bool,
	publish func(ctx context.Context, topic *pubsub.Topic[string, V], keys []string, stamp bool) error,
) (res result, err error) {
	ctx := context.Background()
	b := pubsub.NewBroker()
	// Close stops every worker goroutine and waits for it, so nothing the
	// broker started outlives the run.
	defer func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if cerr := b.Close(cctx); cerr != nil && err == nil {
			err = fmt.Errorf("close: %w", cerr)
		}
	}()

	topic, err := pubsub.NewTopic(b, "bench", codec.String(), values,
		pubsub.WithPartitions(sc.partitions), pubsub.WithRetention(retention))
	if err != nil {
		return res, err
	}
	stamp := sc.pace > 0
	tr := newTracker(n, sc.groups, stamp)
	for g := range sc.groups {
		h := pubsub.HandlerFunc[V](func(_ context.Context, m pubsub.Message[V]) error {
			check(tr, g, m.Value)
			return nil // ack
		})
		bh := pubsub.BatchHandlerFunc[V](func(_ context.Context, msgs []pubsub.Message[V]) error {
			for i := range msgs {
				check(tr, g, msgs[i].Value)
			}
			return nil // ack them all
		})
		for c := range sc.consumers {
			group, consumer := fmt.Sprintf("g%d", g), fmt.Sprintf("c%d", c)
			if batches {
				_, err = topic.SubscribeBatch(group, consumer, bh, pubsub.WithBatchSize(batchSize))
			} else {
				_, err = topic.Subscribe(group, consumer, h)
			}
			if err != nil {
				return res, err
			}
		}
	}

	keys := make([]string, sc.producers)
	if sc.producers > 1 {
		for p := range keys {
			keys[p] = keyFor(p%sc.partitions, sc.partitions)
		}
	}

	m := startMeter()
	err = publish(ctx, topic, keys, stamp)
	if err == nil {
		err = tr.wait(*flagTimeout)
	}
	if err == nil {
		// Every handler has returned; Drain waits for the commits that
		// follow, so the time includes logbus's ack bookkeeping.
		dctx, cancel := context.WithTimeout(ctx, *flagTimeout)
		err = b.Drain(dctx)
		cancel()
	}
	m.stop(&res)
	tr.finish(&res)
	// How often the producers found a partition full and had to wait: in
	// a flat-out run the producer outruns the handler, so this shows how
	// much of the run happened under backpressure.
	st := topic.Stats()
	res.diag = fmt.Sprintf("blocked publishes %d of %d", st.Blocked, st.Published)
	return res, err
}

// keyFor returns a key that the default partitioner (KeyHash, CRC-32 of the
// encoded key; codec.String encodes a string as its bytes) sends to
// partition part of parts.
func keyFor(part, parts int) string {
	kh := pubsub.KeyHash()
	for i := 0; ; i++ {
		k := fmt.Sprintf("producer-%d-%d", part, i)
		if kh.Partition([]byte(k), parts) == part {
			return k
		}
	}
}
