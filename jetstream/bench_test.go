package jetstream

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
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

// BenchmarkKeyConcurrency publishes b.N records of 64 keys, round robin,
// to a one-partition topic, then waits until a group whose handler waits
// 1 ms on a timer (simulated I/O) committed them all: one record of the
// partition at a time (keys=1), or up to 16 of distinct keys at once
// (WithKeyConcurrency(16)). Publishing comes first and out of the clock's
// way only in part: the records are published as the group reads them.
//
//	go test -run '^$' -bench KeyConcurrency -benchtime 2000x -count 6 .
func BenchmarkKeyConcurrency(b *testing.B) {
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			br := brokerOn(b, testServer.Engine(testOptions()...))
			topic, err := pubsub.NewTopic(br, "bench", codec.String(), codec.Bytes(),
				pubsub.WithRetention(pubsub.Retention{MaxMessages: 1 << 20}))
			if err != nil {
				b.Fatal(err)
			}
			h := pubsub.HandlerFunc[[]byte](func(ctx context.Context, _ pubsub.Message[[]byte]) error {
				t := time.NewTimer(time.Millisecond)
				defer t.Stop()
				select {
				case <-t.C:
				case <-ctx.Done():
				}
				return nil
			})
			if _, err := topic.Subscribe("g", "c1", h, pubsub.WithKeyConcurrency(n)); err != nil {
				b.Fatal(err)
			}
			value := make([]byte, 64)
			batch := make([]pubsub.Entry[string, []byte], 64)
			for i := range batch {
				batch[i] = pubsub.Entry[string, []byte]{Key: fmt.Sprint("k", i), Value: value}
			}
			ctx := context.Background()
			b.ResetTimer()
			for sent := 0; sent < b.N; sent += len(batch) {
				if _, err := topic.PublishBatch(ctx, batch[:min(len(batch), b.N-sent)]); err != nil {
					b.Fatal(err)
				}
			}
			if err := br.Drain(ctx); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// BenchmarkDeadLetterReads reads a group's 20,000 dead letters: the
// newest 20 (LatestDeadLetters: batches from the last backwards), all of
// them (DeadLetters), and, for comparison, all of them one request per
// letter, oldest first, as DeadLetters read them before (getLetters, now
// the fallback for a stream without direct gets); over an in-process
// connection (conn=inproc) and over loopback TCP (conn=tcp), as another
// process reads them.
//
//	go test -run '^$' -bench DeadLetterReads -count 6 .
func BenchmarkDeadLetterReads(b *testing.B) {
	const n = 20000
	opts := testOptions()
	br := brokerOn(b, testServer.Engine(opts...))
	topic, err := pubsub.NewTopic(br, "orders", codec.String(), codec.String())
	if err != nil {
		b.Fatal(err)
	}
	if _, err := topic.Subscribe("g", "c1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }),
		pubsub.WithDeadLetterLimit(n)); err != nil {
		b.Fatal(err)
	}
	fillDeadLetters(b, rawGroup(b, testServer, opts, "orders", 1, "g"), n)
	nc, err := nats.Connect(testServer.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := natsjs.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	for _, conn := range []string{"inproc", "tcp"} {
		g := rawGroup(b, testServer, opts, "orders", 1, "g")
		if conn == "tcp" {
			g = rawGroupOf(b, New(js, opts...), "orders", 1, "g")
		}
		b.Run("conn="+conn, func(b *testing.B) { benchDeadLetterReads(b, g, n) })
	}
}

func benchDeadLetterReads(b *testing.B, g *group, n int) {
	ctx := context.Background()
	b.Run("read=newest20", func(b *testing.B) {
		for b.Loop() {
			if ls, err := g.LatestDeadLetters(ctx, 20); err != nil || len(ls) != 20 {
				b.Fatal(len(ls), err)
			}
		}
	})
	b.Run("read=all", func(b *testing.B) {
		for b.Loop() {
			if ls := g.DeadLetters(); len(ls) != n {
				b.Fatal(len(ls))
			}
		}
	})
	b.Run("read=all-one-by-one", func(b *testing.B) {
		for b.Loop() {
			read := 0
			err := g.letters.getLetters(ctx, 1, uint64(n), func(m *natsjs.RawStreamMsg) bool {
				_ = g.letters.letter(m)
				read++
				return true
			})
			if err != nil || read != n {
				b.Fatal(read, err)
			}
		}
	})
}

// benchPublish publishes b.N records of 64 bytes to topic, one Publish
// (one PubAck awaited) at a time or in PublishBatch calls of 64, and
// reports msgs/s.
func benchPublish(b *testing.B, topic *pubsub.Topic[string, []byte], batched bool) {
	value := make([]byte, 64)
	batch := make([]pubsub.Entry[string, []byte], 64)
	for i := range batch {
		batch[i] = pubsub.Entry[string, []byte]{Key: fmt.Sprint("k", i), Value: value}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	if batched {
		for sent := 0; sent < b.N; sent += len(batch) {
			if _, err := topic.PublishBatch(ctx, batch[:min(len(batch), b.N-sent)]); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		for i := range b.N {
			if _, err := topic.Publish(ctx, batch[i%len(batch)].Key, value); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkSyncAlways publishes to a file-stored topic of one partition on
// an embedded server of its own, with and without WithSyncAlways (an
// fsync per write before the PubAck), one Publish at a time or in
// batches of 64 (PublishBatch).
//
//	go test -run '^$' -bench SyncAlways -benchtime 2000x -count 6 .
func BenchmarkSyncAlways(b *testing.B) {
	for _, sync := range []bool{false, true} {
		for _, publish := range []string{"one", "batch"} {
			b.Run(fmt.Sprintf("sync=%v/publish=%s", sync, publish), func(b *testing.B) {
				var opts []ServerOption
				if sync {
					opts = append(opts, WithSyncAlways())
				}
				srv, err := StartServer(b.TempDir(), opts...)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(srv.Shutdown)
				br := brokerOn(b, srv.Engine(WithPrefix("bench")))
				topic, err := pubsub.NewTopic(br, "bench", codec.String(), codec.Bytes(),
					pubsub.WithRetention(pubsub.Retention{MaxMessages: 1 << 20}))
				if err != nil {
					b.Fatal(err)
				}
				benchPublish(b, topic, publish == "batch")
			})
		}
	}
}

// BenchmarkReplicas publishes to a file-stored topic of one partition on
// a cluster of three servers (child processes on loopback, cluster_test.go)
// with one replica or three, one Publish at a time or in batches of 64.
// A publish to an R3 stream is acknowledged once two of the three servers
// stored it.
//
//	go test -run '^$' -bench Replicas -benchtime 2000x -count 6 .
func BenchmarkReplicas(b *testing.B) {
	c := startCluster(b, 3)
	for _, replicas := range []int{1, 3} {
		for _, publish := range []string{"one", "batch"} {
			b.Run(fmt.Sprintf("replicas=%d/publish=%s", replicas, publish), func(b *testing.B) {
				eng, err := Connect(c.connect("bench"), WithPrefix(fmt.Sprintf("bench%d", prefixes.Add(1))), WithReplicas(replicas))
				if err != nil {
					b.Fatal(err)
				}
				br := brokerOn(b, eng)
				topic, err := pubsub.NewTopic(br, "bench", codec.String(), codec.Bytes(),
					pubsub.WithRetention(pubsub.Retention{MaxMessages: 1 << 20}))
				if err != nil {
					b.Fatal(err)
				}
				benchPublish(b, topic, publish == "batch")
			})
		}
	}
}
