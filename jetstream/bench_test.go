package jetstream

import (
	"context"
	"fmt"
	"testing"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// BenchmarkPublishConsume publishes b.N records of 64 bytes in batches of
// 64 to a topic one group reads, and waits until the group committed them
// all: the engine's throughput with one record in flight per partition
// (consumer=record), or with a batch consumer taking up to 64 records per
// pull, call and commit (consumer=batch); consumer=none publishes alone.
//
//	go test -run '^$' -bench PublishConsume -benchtime 4000x .
func BenchmarkPublishConsume(b *testing.B) {
	for _, kind := range []string{"none", "record", "batch"} {
		for _, storage := range []Storage{MemoryStorage, FileStorage} {
			for _, parts := range []int{1, 4} {
				name := fmt.Sprintf("consumer=%s/storage=%s/partitions=%d", kind, map[Storage]string{MemoryStorage: "memory", FileStorage: "file"}[storage], parts)
				b.Run(name, func(b *testing.B) { benchPublishConsume(b, kind, storage, parts) })
			}
		}
	}
}

func benchPublishConsume(b *testing.B, kind string, storage Storage, parts int) {
	br := brokerOn(b, testServer.Engine(testOptions(WithStorage(storage))...))
	topic, err := pubsub.NewTopic(br, "bench", codec.String(), codec.Bytes(),
		pubsub.WithPartitions(parts), pubsub.WithRetention(pubsub.Retention{MaxMessages: 1 << 20}))
	if err != nil {
		b.Fatal(err)
	}
	switch kind {
	case "none": // publishing alone: what bounds the consumers
	case "batch":
		_, err = topic.SubscribeBatch("g", "c1", pubsub.BatchHandlerFunc[[]byte](func(context.Context, []pubsub.Message[[]byte]) error { return nil }),
			pubsub.WithBatchSize(64))
	default:
		_, err = topic.Subscribe("g", "c1", pubsub.HandlerFunc[[]byte](func(context.Context, pubsub.Message[[]byte]) error { return nil }))
	}
	if err != nil {
		b.Fatal(err)
	}
	value := make([]byte, 64)
	batch := make([]pubsub.Entry[string, []byte], 64)
	for i := range batch {
		batch[i] = pubsub.Entry[string, []byte]{Key: fmt.Sprint("k", i), Value: value}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for sent := 0; sent < b.N; sent += len(batch) {
		n := min(len(batch), b.N-sent)
		if _, err := topic.PublishBatch(ctx, batch[:n]); err != nil {
			b.Fatal(err)
		}
	}
	if err := br.Drain(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
