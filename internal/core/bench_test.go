package core

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Benchmarks of the byte-level engine, without codecs. msgs/s counts a
// record once every group committed it; see pubsub's benchmarks for the
// typed layer and the channel baselines.
//
//	go test -run '^$' -bench . -count 6 ./internal/core/ > new.txt && benchstat new.txt

var value64 = make([]byte, 64)

func benchBroker(b *testing.B, partitions, groups int) (*Broker, *Topic, *atomic.Int64) {
	b.Helper()
	br, err := NewBroker(Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { br.Close(context.Background()) })
	topic, err := br.CreateTopic("bench", TopicSpec{Partitions: partitions,
		Retention: Retention{MaxMessages: 1024, BlockTimeout: time.Minute}})
	if err != nil {
		b.Fatal(err)
	}
	var handled atomic.Int64
	h := func(context.Context, *Delivery) error { handled.Add(1); return nil }
	for g := range groups {
		if _, err := br.Subscribe("bench", fmt.Sprintf("g%d", g), "c", h, nil, GroupSpec{}); err != nil {
			b.Fatal(err)
		}
	}
	return br, topic, &handled
}

// BenchmarkPublish is the engine's publish → deliver → commit path: one
// producer, keyless records, one value slice shared by every record (the
// engine never copies or writes a value).
func BenchmarkPublish(b *testing.B) {
	for _, tc := range []struct{ partitions, groups int }{{1, 0}, {1, 1}, {1, 4}, {4, 1}} {
		b.Run(fmt.Sprintf("partitions=%d/groups=%d", tc.partitions, tc.groups), func(b *testing.B) {
			br, topic, handled := benchBroker(b, tc.partitions, tc.groups)
			// With no group the full partition trims its oldest record
			// under Block too (see trimGrouplessLocked).
			ctx := context.Background()
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				if _, err := topic.Publish(ctx, nil, value64, nil); err != nil {
					b.Fatal(err)
				}
			}
			if err := br.Drain(ctx); err != nil {
				b.Fatal(err)
			}
			elapsed := time.Since(start)
			if got, want := handled.Load(), int64(b.N*tc.groups); got != want {
				b.Fatalf("handled %d, want %d", got, want)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}

// BenchmarkPublishBatch is BenchmarkPublish with PublishBatch: one
// producer appending 64 keyless records per call.
func BenchmarkPublishBatch(b *testing.B) {
	const batch = 64
	fill := func(_ int, rec *Record) error {
		rec.Value = value64
		return nil
	}
	for _, tc := range []struct{ partitions, groups int }{{1, 1}, {1, 4}, {4, 1}} {
		b.Run(fmt.Sprintf("partitions=%d/groups=%d/batch=%d", tc.partitions, tc.groups, batch), func(b *testing.B) {
			br, topic, handled := benchBroker(b, tc.partitions, tc.groups)
			ctx := context.Background()
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				if _, err := topic.PublishBatch(ctx, batch, fill, nil); err != nil {
					b.Fatal(err)
				}
			}
			if err := br.Drain(ctx); err != nil {
				b.Fatal(err)
			}
			elapsed := time.Since(start)
			if got, want := handled.Load(), int64(b.N*batch*tc.groups); got != want {
				b.Fatalf("handled %d, want %d", got, want)
			}
			b.ReportMetric(float64(b.N*batch)/elapsed.Seconds(), "msgs/s")
		})
	}
}

// BenchmarkMemoryBoundedByRetention pushes records through 4 partitions of
// 1024 and reports the live heap once they are full, and what each retained
// record costs. The heap stays flat however many records pass. heap-MiB is
// the whole test process's live heap, so it grows with what the package's
// tests import: importing rapid here once added 1.1 MiB to it.
func BenchmarkMemoryBoundedByRetention(b *testing.B) {
	br, topic, _ := benchBroker(b, 4, 1)
	ctx := context.Background()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	base := heap()
	for range 4 * 1024 { // fill the retention
		topic.Publish(ctx, nil, make([]byte, 64), nil)
	}
	br.Drain(ctx)
	full := heap()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := topic.Publish(ctx, nil, make([]byte, 64), nil); err != nil {
			b.Fatal(err)
		}
	}
	br.Drain(ctx)
	after := heap()
	b.ReportMetric(float64(after)/(1<<20), "heap-MiB")
	b.ReportMetric(float64(full-base)/(4*1024), "B/retained-record")
}

// BenchmarkIdle parks 16,000 workers (1,000 topics × 8 partitions × 2
// groups) and reports the memory each costs and the CPU the process burns
// per second of idling, beside the same process with no broker: the two
// should match, since workers wait on channels, never on timers.
func BenchmarkIdle(b *testing.B) {
	for _, topics := range []int{0, 1000} {
		b.Run(fmt.Sprintf("workers=%d", topics*16), func(b *testing.B) { benchmarkIdle(b, topics) })
	}
}

func benchmarkIdle(b *testing.B, topics int) {
	const partitions, groups = 8, 2
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	br, err := NewBroker(Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close(context.Background())
	h := func(context.Context, *Delivery) error { return nil }
	for i := range topics {
		name := fmt.Sprintf("t%d", i)
		if _, err := br.CreateTopic(name, TopicSpec{Partitions: partitions, Retention: Retention{MaxMessages: 16}}); err != nil {
			b.Fatal(err)
		}
		for g := range groups {
			if _, err := br.Subscribe(name, fmt.Sprintf("g%d", g), "c", h, nil, GroupSpec{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	debug.FreeOSMemory() // return what setup freed now, not while idling
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	// Idle for 100ms per iteration: this benchmark measures doing nothing,
	// so each iteration waits for a timer and nothing else.
	used := cpu()
	start := time.Now()
	idle := time.NewTimer(0)
	<-idle.C
	for b.Loop() {
		idle.Reset(100 * time.Millisecond)
		<-idle.C
	}
	idled := time.Since(start)
	used = cpu() - used
	if workers := topics * partitions * groups; workers > 0 {
		inUse := func(m runtime.MemStats) float64 { return float64(m.HeapAlloc + m.StackInuse) }
		b.ReportMetric((inUse(after)-inUse(before))/float64(workers), "B/worker")
	}
	b.ReportMetric(float64(used.Microseconds())/idled.Seconds(), "cpu-µs/idle-s")
}
