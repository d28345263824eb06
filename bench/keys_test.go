package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"hash/crc32"
	"sync"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// keyCount is how many keys the records of BenchmarkKeyConcurrency spread
// over, round robin, in one partition.
const keyCount = 64

// keyRecords is how many records one iteration publishes and waits for.
const keyRecords = 1024

// keyWork is a handler's work on one record: wait 1ms on a timer
// (simulated I/O: the goroutine sleeps, as on a network call), or hash
// 16 KiB (CPU-bound, about 10µs on the machine of the table).
type keyWork string

const (
	workIO  keyWork = "io1ms"
	workCPU keyWork = "cpu16KiB"
)

var cpuPayload = make([]byte, 16<<10)

// do does the work, or for I/O waits on a timer until ctx ends.
func (w keyWork) do(ctx context.Context) {
	if w == workIO {
		t := time.NewTimer(time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		return
	}
	sha256.Sum256(cpuPayload)
}

// BenchmarkKeyConcurrency measures WithKeyConcurrency(n) (issue 26) on one
// partition of 64 keys: n = 1, 4, 16, 64, beside a hand-rolled pool of 16
// goroutines keyed by hash (impl=pool: an n = 1 handler hands each record
// to the goroutine of its key's CRC-32 and acks at once, what users write
// today, keeping none of the guarantees: a record is committed before it
// is handled). One iteration publishes 1024 records and waits until every
// one was handled; msgs/s is the rate. Run the I/O rows as they come and
// the CPU rows with -cpu 1 (one core):
//
//	go test -run '^$' -bench 'KeyConcurrency/work=io' -count 10 .
//	go test -run '^$' -bench 'KeyConcurrency/work=cpu' -cpu 1 -count 10 .
func BenchmarkKeyConcurrency(b *testing.B) {
	for _, work := range []keyWork{workIO, workCPU} {
		for _, n := range []int{1, 4, 16, 64} {
			b.Run(fmt.Sprintf("work=%s/impl=keys/n=%d", work, n), func(b *testing.B) { benchKeys(b, work, n, false) })
		}
		b.Run(fmt.Sprintf("work=%s/impl=pool/n=16", work), func(b *testing.B) { benchKeys(b, work, 16, true) })
	}
}

func benchKeys(b *testing.B, work keyWork, n int, pool bool) {
	broker := pubsub.NewBroker()
	b.Cleanup(func() { _ = broker.Close(context.Background()) })
	topic, err := pubsub.NewTopic(broker, "jobs", codec.String(), codec.Bytes(),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: 4 * keyRecords}))
	if err != nil {
		b.Fatal(err)
	}
	var handled sync.WaitGroup
	var h pubsub.HandlerFunc[[]byte] = func(ctx context.Context, _ pubsub.Message[[]byte]) error {
		work.do(ctx)
		handled.Done()
		return nil
	}
	var opts []pubsub.SubscribeOption
	if pool {
		h = handPool(b, work, n, &handled)
	} else {
		opts = append(opts, pubsub.WithKeyConcurrency(n))
	}
	if _, err := topic.Subscribe("g", "c", h, opts...); err != nil {
		b.Fatal(err)
	}
	keys := make([]string, keyCount)
	for i := range keys {
		keys[i] = fmt.Sprintf("customer-%02d", i)
	}
	value := make([]byte, 64)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		handled.Add(keyRecords)
		for i := range keyRecords {
			if _, err := topic.Publish(ctx, keys[i%keyCount], value); err != nil {
				b.Fatal(err)
			}
		}
		handled.Wait()
	}
	if err := broker.Drain(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N*keyRecords)/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*keyRecords), "ns/msg")
}

// handPool is the hand-rolled pool: n goroutines, each with a channel of
// its own, fed by an n = 1 handler that hashes the key to pick one and
// acks at once. Per-key order holds within the process while nothing
// fails; nothing else does (a record is committed before it is handled, a
// failure is lost, Close does not wait for the pool).
func handPool(b *testing.B, work keyWork, n int, handled *sync.WaitGroup) pubsub.HandlerFunc[[]byte] {
	lanes := make([]chan struct{}, n)
	var done sync.WaitGroup
	for i := range lanes {
		lanes[i] = make(chan struct{}, 64)
		done.Go(func() { // exits when its lane is closed, at cleanup
			for range lanes[i] {
				work.do(context.Background()) // the pool's lanes outlive the handler's ctx
				handled.Done()
			}
		})
	}
	b.Cleanup(func() {
		for _, l := range lanes {
			close(l)
		}
		done.Wait()
	})
	return func(_ context.Context, m pubsub.Message[[]byte]) error {
		lanes[crc32.ChecksumIEEE(m.Key)%uint32(n)] <- struct{}{}
		return nil
	}
}
