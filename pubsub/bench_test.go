package pubsub_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// The benchmarks measure end-to-end throughput: a record counts once every
// group's handler has acked it and its offset is committed. Publish runs in
// b.Loop; the time to drain what is still buffered when the loop ends (at
// most MaxMessages records per partition) is included in msgs/s, which is
// why msgs/s, not ns/op, is the figure to compare. The channel benchmarks
// are the same scenarios on raw buffered channels, for the ratio.
//
//	go test -run '^$' -bench . -count 6 ./pubsub/ > new.txt && benchstat new.txt

var payload64 = make([]byte, 64)

type payloadJSON struct {
	Data []byte
}

const benchBuffer = 1024

// benchTopic returns a topic with partitions partitions and groups groups
// of consumers consumers each, whose handlers ack and count.
func benchTopic[V any](b *testing.B, values codec.Codec[V], partitions, groups, consumers int, opts ...pubsub.BrokerOption) (*pubsub.Broker, *pubsub.Topic[string, V], counts) {
	b.Helper()
	return benchTopicOf(b, values, partitions, groups, consumers, false, opts...)
}

// benchTopicOf is benchTopic; batches subscribes batch consumers
// (SubscribeBatch, the default batch size) instead.
func benchTopicOf[V any](b *testing.B, values codec.Codec[V], partitions, groups, consumers int, batches bool, opts ...pubsub.BrokerOption) (*pubsub.Broker, *pubsub.Topic[string, V], counts) {
	b.Helper()
	br := pubsub.NewBroker(opts...)
	b.Cleanup(func() { br.Close(context.Background()) })
	topic, err := pubsub.NewTopic(br, "bench", codec.String(), values,
		pubsub.WithPartitions(partitions),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: benchBuffer, BlockTimeout: time.Minute}))
	if err != nil {
		b.Fatal(err)
	}
	// The count is on a cache line of its own, so that the benchmark does
	// not measure false sharing between its counter and whatever the
	// allocator put next to it.
	handled := make(counts, groups*partitions)
	for g := range groups {
		// One counter per group and partition, written by one worker: the
		// benchmark's own counting is no point of contention.
		group := handled[g*partitions : (g+1)*partitions]
		h := pubsub.HandlerFunc[V](func(_ context.Context, msg pubsub.Message[V]) error {
			group[msg.Partition].Add(1)
			return nil
		})
		bh := pubsub.BatchHandlerFunc[V](func(_ context.Context, msgs []pubsub.Message[V]) error {
			group[msgs[0].Partition].Add(int64(len(msgs)))
			return nil
		})
		for c := range consumers {
			var err error
			if batches {
				_, err = topic.SubscribeBatch(fmt.Sprintf("g%d", g), fmt.Sprintf("c%d", c), bh)
			} else {
				_, err = topic.Subscribe(fmt.Sprintf("g%d", g), fmt.Sprintf("c%d", c), h)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	return br, topic, handled
}

type paddedCount struct {
	atomic.Int64
	_ [56]byte
}

// counts are padded counters; Load sums them.
type counts []paddedCount

func (c counts) Load() int64 {
	var sum int64
	for i := range c {
		sum += c[i].Load()
	}
	return sum
}

// finish drains, checks every record was handled by every group, and
// reports msgs/s (published records per second, drain included).
func finish(b *testing.B, br *pubsub.Broker, handled interface{ Load() int64 }, published, groups int, start time.Time) {
	b.Helper()
	if err := br.Drain(context.Background()); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	if got, want := handled.Load(), int64(published*groups); got != want {
		b.Fatalf("handled %d, want %d", got, want)
	}
	b.ReportMetric(float64(published)/elapsed.Seconds(), "msgs/s")
}

// benchmarkOneProducer publishes value, keyless, from one goroutine to a
// topic of partitions partitions read by groups groups of one consumer, and
// reports msgs/s. With batch > 1 each iteration publishes batch records in
// one PublishValues call; otherwise one PublishValue call.
func benchmarkOneProducer[V any](b *testing.B, values codec.Codec[V], value V, partitions, groups, batch int) {
	benchmarkOneProducerOf(b, values, value, partitions, groups, batch, false)
}

// asyncBatch is the batch argument that makes the one-producer scenarios
// publish with PublishValueAsync, one record per call, and Flush at the
// end.
const asyncBatch = -1

func benchmarkOneProducerOf[V any](b *testing.B, values codec.Codec[V], value V, partitions, groups, batch int, batches bool) {
	br, topic, handled := benchTopicOf(b, values, partitions, groups, 1, batches)
	ctx := context.Background()
	b.ReportAllocs()
	start := time.Now()
	if batch == asyncBatch {
		for b.Loop() {
			topic.PublishValueAsync(ctx, value)
		}
		if err := topic.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		finish(b, br, handled, b.N, groups, start)
		return
	}
	if batch > 1 {
		vs := make([]V, batch)
		for i := range vs {
			vs[i] = value
		}
		for b.Loop() {
			if _, err := topic.PublishValues(ctx, vs); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		for b.Loop() {
			if _, err := topic.PublishValue(ctx, value); err != nil {
				b.Fatal(err)
			}
		}
	}
	finish(b, br, handled, b.N*batch, groups, start)
}

// byteCodecs are the codecs the scenarios run with: bytes, which hands each
// handler a copy, and raw, which hands it the log's own bytes (one
// allocation per delivery fewer).
var byteCodecs = []struct {
	name  string
	codec codec.Codec[[]byte]
}{{"bytes", codec.Bytes()}, {"raw", codec.RawBytes()}}

// BenchmarkS1 is one producer → one partition → one group that acks,
// publishing one record per call (batch=1) or 64 (batch=64); publish=async
// is batch=1 with PublishValueAsync.
func BenchmarkS1(b *testing.B) {
	for _, c := range byteCodecs {
		for _, batch := range []int{1, 64} {
			b.Run(fmt.Sprintf("codec=%s/batch=%d", c.name, batch), func(b *testing.B) {
				benchmarkOneProducer(b, c.codec, payload64, 1, 1, batch)
			})
		}
		b.Run(fmt.Sprintf("codec=%s/batch=1/publish=async", c.name), func(b *testing.B) {
			benchmarkOneProducer(b, c.codec, payload64, 1, 1, asyncBatch)
		})
	}
	b.Run("codec=json/batch=1", func(b *testing.B) {
		benchmarkOneProducer(b, codec.JSON[payloadJSON](), payloadJSON{Data: payload64}, 1, 1, 1)
	})
}

// BenchmarkS2 is one producer → one partition → four groups: each record is
// appended once and read by all four. publish=async as in S1.
func BenchmarkS2(b *testing.B) {
	for _, c := range byteCodecs {
		for _, batch := range []int{1, 64} {
			b.Run(fmt.Sprintf("codec=%s/batch=%d", c.name, batch), func(b *testing.B) {
				benchmarkOneProducer(b, c.codec, payload64, 1, 4, batch)
			})
		}
		b.Run(fmt.Sprintf("codec=%s/batch=1/publish=async", c.name), func(b *testing.B) {
			benchmarkOneProducer(b, c.codec, payload64, 1, 4, asyncBatch)
		})
	}
}

// BenchmarkS3 is four producers → four partitions → one group of four
// consumers. Each producer publishes with its own key, one record per call
// (batch=1) or 64 (batch=64); publish=async is batch=1 with PublishAsync.
func BenchmarkS3(b *testing.B) {
	for _, c := range byteCodecs {
		for _, batch := range []int{1, 64} {
			b.Run(fmt.Sprintf("codec=%s/batch=%d", c.name, batch), func(b *testing.B) { benchmarkS3(b, c.codec, batch) })
		}
		b.Run(fmt.Sprintf("codec=%s/batch=1/publish=async", c.name), func(b *testing.B) { benchmarkS3(b, c.codec, asyncBatch) })
	}
}

func benchmarkS3(b *testing.B, values codec.Codec[[]byte], batch int) {
	benchmarkS3Of(b, values, batch, false)
}

func benchmarkS3Of(b *testing.B, values codec.Codec[[]byte], batch int, batches bool) {
	br, topic, handled := benchTopicOf(b, values, 4, 1, 4, batches)
	var producers, published atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(max(1, 4/runtime.GOMAXPROCS(0))) // 4 producers
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		key := fmt.Sprintf("producer-%d", producers.Add(1))
		entries := make([]pubsub.Entry[string, []byte], max(batch, 1))
		for i := range entries {
			entries[i] = pubsub.Entry[string, []byte]{Key: key, Value: payload64}
		}
		n := int64(0)
		for pb.Next() {
			var err error
			switch {
			case batch == asyncBatch:
				topic.PublishAsync(ctx, key, payload64)
				n++
				continue
			case batch > 1:
				_, err = topic.PublishBatch(ctx, entries)
			default:
				_, err = topic.Publish(ctx, key, payload64)
			}
			if err != nil {
				b.Error(err)
				return
			}
			n += int64(batch)
		}
		published.Add(n)
	})
	if err := topic.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	finish(b, br, handled, int(published.Load()), 1, start)
}

// BenchmarkBatchConsumer is S1, S2 and S3 with batches at both ends:
// PublishValues or PublishBatch of 64, and SubscribeBatch consumers.
func BenchmarkBatchConsumer(b *testing.B) {
	for _, c := range byteCodecs {
		b.Run("scenario=S1/codec="+c.name, func(b *testing.B) { benchmarkOneProducerOf(b, c.codec, payload64, 1, 1, 64, true) })
		b.Run("scenario=S2/codec="+c.name, func(b *testing.B) { benchmarkOneProducerOf(b, c.codec, payload64, 1, 4, 64, true) })
		b.Run("scenario=S3/codec="+c.name, func(b *testing.B) { benchmarkS3Of(b, c.codec, 64, true) })
	}
}

// BenchmarkStream is S1 read through a Stream that acks each delivery: a
// channel hand-off per record on top of the engine's work.
func BenchmarkStream(b *testing.B) {
	b.Run("batch=1", func(b *testing.B) {
		br := pubsub.NewBroker()
		b.Cleanup(func() { br.Close(context.Background()) })
		topic, err := pubsub.NewTopic(br, "bench", codec.String(), codec.Bytes(),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: benchBuffer, BlockTimeout: time.Minute}))
		if err != nil {
			b.Fatal(err)
		}
		stream, err := topic.Stream("g", "c")
		if err != nil {
			b.Fatal(err)
		}
		var handled atomic.Int64
		var wg sync.WaitGroup
		wg.Go(func() { // exits when Close closes the stream's channel
			for d := range stream.All() {
				d.Ack()
				handled.Add(1)
			}
		})
		ctx := context.Background()
		b.ReportAllocs()
		start := time.Now()
		for b.Loop() {
			if _, err := topic.PublishValue(ctx, payload64); err != nil {
				b.Fatal(err)
			}
		}
		finish(b, br, &handled, b.N, 1, start)
		if err := br.Close(ctx); err != nil {
			b.Fatal(err)
		}
		wg.Wait()
	})
}

// BenchmarkScaling varies partitions and groups with one producer that
// spreads keyless records round robin.
func BenchmarkScaling(b *testing.B) {
	for _, parts := range []int{1, 4, 16, 64} {
		for _, groups := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("partitions=%d/groups=%d", parts, groups), func(b *testing.B) {
				benchmarkOneProducer(b, codec.Bytes(), payload64, parts, groups, 1)
			})
		}
	}
}

// The channel equivalents.

// BenchmarkChannelS1 is one producer → one buffered channel → one
// consumer, sending one value per send (batch=1) or a slice of 64 values
// (batch=64), the channel's own way of batching.
func BenchmarkChannelS1(b *testing.B) {
	b.Run("batch=1", func(b *testing.B) {
		chans, wait := channelConsumers(1)
		b.ReportAllocs()
		start := time.Now()
		for b.Loop() {
			chans[0] <- payload64
		}
		if handled := wait(); handled != int64(b.N) {
			b.Fatalf("handled %d of %d", handled, b.N)
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	})
	b.Run("batch=64", func(b *testing.B) {
		ch := make(chan [][]byte, benchBuffer/64)
		var handled int64
		var wg sync.WaitGroup
		wg.Go(func() { // exits when ch is closed
			for batch := range ch {
				handled += int64(len(batch))
			}
		})
		b.ReportAllocs()
		start := time.Now()
		for b.Loop() {
			batch := make([][]byte, 64) // the consumer owns it once sent
			for i := range batch {
				batch[i] = payload64
			}
			ch <- batch
		}
		close(ch)
		wg.Wait()
		if handled != int64(64*b.N) {
			b.Fatalf("handled %d of %d", handled, 64*b.N)
		}
		b.ReportMetric(float64(64*b.N)/time.Since(start).Seconds(), "msgs/s")
	})
}

// channelConsumers starts n consumers, each draining its own buffered
// channel, and returns the channels and a wait that closes them and returns
// how many values were received in all.
func channelConsumers(n int) ([]chan []byte, func() int64) {
	chans := make([]chan []byte, n)
	var wg sync.WaitGroup
	var handled atomic.Int64
	for i := range chans {
		chans[i] = make(chan []byte, benchBuffer)
		wg.Go(func() { // exits when its channel is closed
			n := int64(0)
			for range chans[i] {
				n++
			}
			handled.Add(n)
		})
	}
	return chans, func() int64 {
		for _, ch := range chans {
			close(ch)
		}
		wg.Wait()
		return handled.Load()
	}
}

// BenchmarkChannelS2 fans each record out to four channels: the producer
// sends the same slice to each (no copy, the cheapest fan-out a channel can
// do).
func BenchmarkChannelS2(b *testing.B) {
	chans, wait := channelConsumers(4)
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		for _, ch := range chans {
			ch <- payload64
		}
	}
	if handled := wait(); handled != int64(4*b.N) {
		b.Fatalf("handled %d of %d", handled, 4*b.N)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkChannelS3 is four producers → four channels → four consumers.
func BenchmarkChannelS3(b *testing.B) {
	chans, wait := channelConsumers(4)
	var producer atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(max(1, 4/runtime.GOMAXPROCS(0)))
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		ch := chans[(producer.Add(1)-1)%4]
		for pb.Next() {
			ch <- payload64
		}
	})
	if handled := wait(); handled != int64(b.N) {
		b.Fatalf("handled %d of %d", handled, b.N)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// noopHooks implements the per-record hooks and does nothing: what a hook
// costs a record, before it does any work of its own.
type noopHooks struct{}

func (noopHooks) OnPublish(ctx context.Context, _ *pubsub.PublishInfo) context.Context     { return ctx }
func (noopHooks) OnPublished(context.Context, *pubsub.PublishInfo, pubsub.Position, error) {}
func (noopHooks) OnDeliver(ctx context.Context, _ *pubsub.DeliveryInfo) context.Context    { return ctx }

// noopDelivered asks for delivery durations, so each delivery is timed.
type noopDelivered struct{}

func (noopDelivered) OnDelivered(context.Context, *pubsub.DeliveryInfo, pubsub.DeliveryResult) {}

// BenchmarkObserved is S1 (one producer, one partition, one group, bytes,
// one record per call) with what observes the broker: nothing, no-op
// publish and delivery hooks, a hook that wants delivery durations, a
// logger at Info (which logs nothing per record), and the stuck watchdog.
func BenchmarkObserved(b *testing.B) {
	for _, c := range []struct {
		name string
		opts []pubsub.BrokerOption
	}{
		{"none", nil},
		{"hooks=noop", []pubsub.BrokerOption{pubsub.WithHooks(noopHooks{})}},
		{"hooks=timed", []pubsub.BrokerOption{pubsub.WithHooks(noopDelivered{})}},
		{"logger=info", []pubsub.BrokerOption{pubsub.WithLogger(slog.New(slog.DiscardHandler))}},
		{"stuck=1s", []pubsub.BrokerOption{pubsub.WithStuckAfter(time.Second)}},
	} {
		b.Run(c.name, func(b *testing.B) {
			br, topic, handled := benchTopic(b, codec.Bytes(), 1, 1, 1, c.opts...)
			ctx := context.Background()
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				if _, err := topic.PublishValue(ctx, payload64); err != nil {
					b.Fatal(err)
				}
			}
			finish(b, br, handled, b.N, 1, start)
		})
	}
}
