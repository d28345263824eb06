package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	ljs "github.com/logbus/logbus/jetstream"
	"github.com/logbus/logbus/pubsub"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The JetStream rows: the raw nats.go JetStream client against logbus's
// JetStream engine, doing the same work, so that what the engine costs on
// top of the client can be read off one run. Unlike the program's peers
// (main.go), these are Go benchmarks:
//
//	cd bench && go test -run '^$' -bench 'JetStream' -benchtime 20000x -count 5 . | tee js.txt
//	benchstat -col /impl js.txt
//
// The work, for both: an embedded server (file or memory storage) on
// loopback TCP; one stream per partition; one producer publishing keyed
// 64-byte records asynchronously (1000 keys, CRC-32 of the key mod the
// partitions, the key in a header) and waiting for every PubAck; one group
// of one member on its own connection, a durable consumer per partition
// with explicit acks, acking after its handler returned. "inflight" is the
// consumers' MaxAckPending: 1 keeps per-key order under retries and
// failover (what logbus promises); more does not. "faults" makes one record
// in that many fail once (a Nak with a 5ms delay), to show what a retry
// does to order.
//
// BenchmarkJetStreamBacklog does the same with delivery paused while the
// records are published, timing the consumption alone.
//
// Metrics: msgs/s from the first publish to the last record handled (ns/op
// is its inverse); p50-us and p99-us, publish → handler latency of a paced
// run at half that rate after the timed one (1000 records, outside the
// timer); reordered/op, the share of deliveries that came after a later
// record of the same partition had been handled, and key-reordered/op the
// same per key (1000 keys spread the partitions' records thin, so a key's
// next record often comes after a retry's delay); redelivered/op, the share
// of deliveries of a record handled before; lost/op, the share of
// deliveries that came with Attempt > 1 although no handler had been given
// the record before (the client dropped a delivery; it came back after
// AckWait).

// jsWork is one benchmark's shape.
type jsWork struct {
	storage    jetstream.StorageType
	partitions int
	inflight   int  // MaxAckPending per partition
	faultEvery int  // 0: none; n: records whose seq%n == n-1 fail once
	backlog    bool // publish first, delivery paused; time the consumption alone
}

func (w jsWork) String() string {
	storage := "file"
	if w.storage == jetstream.MemoryStorage {
		storage = "memory"
	}
	return fmt.Sprintf("storage=%s/partitions=%d/inflight=%d/faults=%d", storage, w.partitions, w.inflight, w.faultEvery)
}

const (
	jsKeys       = 1000
	jsLatencyN   = 1000
	jsFaultDelay = 5 * time.Millisecond
	jsTimeout    = 2 * time.Minute
)

// jsKeyNames and jsKeyHeaders are the keys, made once.
var jsKeyNames = func() []string {
	ks := make([]string, jsKeys)
	for i := range ks {
		ks[i] = "key-" + strconv.Itoa(i)
	}
	return ks
}()

// jsSink is what every implementation's handler reports to. It checks
// per-key order and duplicates, counts completions and samples latency. It
// is safe for concurrent use.
type jsSink struct {
	work      jsWork
	total     int // records that must complete
	done      chan struct{}
	count     atomic.Int64
	seen      []atomic.Bool   // by seq: handled ok once
	tried     []atomic.Bool   // by seq: given to the handler once
	maxSeq    []atomic.Uint64 // by key: 1 + the highest seq handled ok
	maxPSeq   []atomic.Uint64 // by partition: the same
	partition []int           // by key: its partition, as logbus routes it
	// Counted over every delivery.
	deliveries, reordered, keyReordered, redelivered atomic.Int64
	// lost counts deliveries with Attempt > 1 of records no handler had
	// been given: the server delivered them before, and the client lost
	// them, so they came back only after AckWait.
	lost atomic.Int64
	mu   sync.Mutex
	lat  []time.Duration // guarded by mu
}

func newJSSink(w jsWork, total int) *jsSink {
	s := &jsSink{work: w, total: total, done: make(chan struct{}),
		seen: make([]atomic.Bool, total), tried: make([]atomic.Bool, total), maxSeq: make([]atomic.Uint64, jsKeys),
		maxPSeq: make([]atomic.Uint64, w.partitions), partition: make([]int, jsKeys)}
	for k, name := range jsKeyNames {
		s.partition[k] = jsPartition(name, w.partitions)
	}
	return s
}

// jsPartition is logbus's KeyHash: CRC-32 (IEEE) of the key mod the
// partitions.
func jsPartition(key string, partitions int) int {
	return int(crc32.ChecksumIEEE([]byte(key)) % uint32(partitions))
}

// raise records seq as handled in *max (1 + the highest seq) and reports
// whether a later seq had been handled before it.
func raise(max *atomic.Uint64, seq uint64) (late bool) {
	for {
		m := max.Load()
		if m >= seq+1 {
			return m > seq+1
		}
		if max.CompareAndSwap(m, seq+1) {
			return false
		}
	}
}

// handle is the handler's body: payload is the record's value, attempt its
// delivery count. It returns an error for an injected fault.
func (s *jsSink) handle(payload []byte, attempt int) error {
	s.deliveries.Add(1)
	stamp := int64(binary.LittleEndian.Uint64(payload[0:8]))
	seq := binary.LittleEndian.Uint64(payload[8:16])
	if !s.tried[seq].Swap(true) && attempt > 1 {
		s.lost.Add(1)
	}
	if n := s.work.faultEvery; n > 0 && seq%uint64(n) == uint64(n-1) && attempt == 1 {
		return errInjected
	}
	key := seq % jsKeys
	if raise(&s.maxSeq[key], seq) {
		s.keyReordered.Add(1)
	}
	if raise(&s.maxPSeq[s.partition[key]], seq) {
		s.reordered.Add(1)
	}
	if s.seen[seq].Swap(true) {
		s.redelivered.Add(1)
		return nil
	}
	if stamp != 0 {
		d := time.Duration(time.Now().UnixNano() - stamp)
		s.mu.Lock()
		s.lat = append(s.lat, d)
		s.mu.Unlock()
	}
	if s.count.Add(1) == int64(s.total) {
		close(s.done)
	}
	return nil
}

var errInjected = fmt.Errorf("injected fault")

func (s *jsSink) wait() error {
	select {
	case <-s.done:
		return nil
	case <-time.After(jsTimeout):
		return fmt.Errorf("%d of %d records handled after %v", s.count.Load(), s.total, jsTimeout)
	}
}

// jsRecord fills a fresh payload for record seq: the send time (0 when not
// stamped) and seq.
func jsRecord(seq uint64, stamp bool) (key string, payload []byte) {
	payload = make([]byte, payloadSize)
	fillPayload(payload, seq, stamp)
	return jsKeyNames[seq%jsKeys], payload
}

// jsImpl is one way of doing the work: start sets up the server side and
// the consumer, reporting every delivery to sink, and returns how to
// publish one record and how to wait for every publish to be stored.
type jsImpl func(b *testing.B, w jsWork, sink *jsSink) jsClient

// jsClient is what an implementation gives runJS: how to publish one
// record, how to wait until every publish is stored, and how to stop and
// restart delivery (server-side) for the backlog runs.
type jsClient struct {
	publish       func(key string, payload []byte) error
	flush         func() error
	pause, resume func() error
}

// runJS is the benchmark body shared by every implementation: b.N
// records, timed from the first publish to the last handled, then a paced
// latency run of jsLatencyN more. With w.backlog the records are published
// while delivery is paused, and the clock runs from the resume: what the
// consuming side alone can do.
func runJS(b *testing.B, w jsWork, impl jsImpl) {
	lat := min(jsLatencyN, b.N)
	if w.backlog {
		lat = 0 // the latency of a backlog is its queueing
	}
	sink := newJSSink(w, b.N+lat)
	c := impl(b, w, sink)
	publish, flush := c.publish, c.flush

	if w.backlog {
		if err := c.pause(); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	start := time.Now()
	if w.backlog {
		b.StopTimer()
	}
	for i := range b.N {
		key, payload := jsRecord(uint64(i), false)
		if err := publish(key, payload); err != nil {
			b.Fatal(err)
		}
	}
	if err := flush(); err != nil {
		b.Fatal(err)
	}
	if w.backlog {
		b.StartTimer()
		start = time.Now()
		if err := c.resume(); err != nil {
			b.Fatal(err)
		}
	}
	// Completion of the first b.N: the sink counts them all, and the
	// latency run's records are not published yet.
	for sink.count.Load() < int64(b.N) {
		select {
		case <-sink.done:
		case <-time.After(time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	rate := float64(b.N) / elapsed.Seconds()

	// Paced at half the rate just measured, sleeping until each record is
	// due: spinning would take a core from the consumer.
	interval := time.Duration(float64(time.Second) / (rate / 2))
	pace := time.NewTicker(max(interval, time.Microsecond))
	defer pace.Stop()
	for i := range lat {
		if i > 0 {
			<-pace.C
		}
		key, payload := jsRecord(uint64(b.N+i), true)
		if err := publish(key, payload); err != nil {
			b.Fatal(err)
		}
		// Each record goes at once: a batch would wait for the next.
		if err := flush(); err != nil {
			b.Fatal(err)
		}
	}
	if err := flush(); err != nil {
		b.Fatal(err)
	}
	if err := sink.wait(); err != nil {
		b.Fatal(err)
	}

	b.ReportMetric(rate, "msgs/s")
	sink.mu.Lock()
	slices.Sort(sink.lat)
	if n := len(sink.lat); n > 0 {
		b.ReportMetric(float64(sink.lat[n/2].Microseconds()), "p50-us")
		b.ReportMetric(float64(sink.lat[(n*99)/100].Microseconds()), "p99-us")
	}
	sink.mu.Unlock()
	deliveries := float64(sink.deliveries.Load())
	b.ReportMetric(float64(sink.reordered.Load())/deliveries, "reordered/op")
	b.ReportMetric(float64(sink.keyReordered.Load())/deliveries, "key-reordered/op")
	b.ReportMetric(float64(sink.redelivered.Load())/deliveries, "redelivered/op")
	b.ReportMetric(float64(sink.lost.Load())/deliveries, "lost/op")
}

// jsWorks is the matrix: 1 and 4 partitions, file and memory storage, one
// record in flight per partition; then, on 4 partitions with file storage,
// 1000 in flight, and both with a fault in every 1000 records.
func jsWorks() []jsWork {
	var ws []jsWork
	for _, st := range []jetstream.StorageType{jetstream.FileStorage, jetstream.MemoryStorage} {
		for _, p := range []int{1, 4} {
			ws = append(ws, jsWork{storage: st, partitions: p, inflight: 1})
		}
	}
	return append(ws,
		jsWork{storage: jetstream.FileStorage, partitions: 4, inflight: 1000},
		jsWork{storage: jetstream.FileStorage, partitions: 4, inflight: 1, faultEvery: 1000},
		jsWork{storage: jetstream.FileStorage, partitions: 4, inflight: 1000, faultEvery: 1000},
	)
}

func BenchmarkJetStream(b *testing.B) {
	for _, w := range jsWorks() {
		b.Run("impl=raw/"+w.String(), func(b *testing.B) { runJS(b, w, rawJS(rawMode{})) })
		if w.inflight != 1 {
			continue // the engine keeps one record in flight per partition
		}
		if w.faultEvery == 0 && w.storage == jetstream.FileStorage {
			for _, m := range []rawMode{{doubleAck: true}, {fetch: true}, {fetch: true, doubleAck: true}} {
				b.Run("impl="+m.String()+"/"+w.String(), func(b *testing.B) { runJS(b, w, rawJS(m)) })
			}
		}
		b.Run("impl=logbus/"+w.String(), func(b *testing.B) { runJS(b, w, logbusJS(1)) })
		b.Run("impl=logbus-batch/"+w.String(), func(b *testing.B) { runJS(b, w, logbusJS(jsBatch)) })
		b.Run("impl=logbus-async/"+w.String(), func(b *testing.B) { runJS(b, w, logbusJS(jsAsync)) })
	}
}

// BenchmarkJetStreamBacklog times the consuming side alone: the records
// are published while the group is paused on the server, and the clock
// runs from the resume to the last record handled (as the spike's "drain
// backlog" did). It compares one record in flight per partition with 1000,
// where the producer's pace in BenchmarkJetStream may hide the difference.
func BenchmarkJetStreamBacklog(b *testing.B) {
	for _, inflight := range []int{1, 1000} {
		for _, faults := range []int{0, 1000} {
			w := jsWork{storage: jetstream.FileStorage, partitions: 4, inflight: inflight, faultEvery: faults, backlog: true}
			b.Run("impl=raw/"+w.String(), func(b *testing.B) { runJS(b, w, rawJS(rawMode{})) })
			if inflight == 1 {
				b.Run("impl=logbus/"+w.String(), func(b *testing.B) { runJS(b, w, logbusJS(jsBatch)) })
			}
		}
	}
}

// jsBatch is how many records the logbus-batch rows give PublishBatch at
// once, as the program's -batch peers do.
const jsBatch = 64

// jsAsync is the batch argument of the logbus-async rows: PublishAsync for
// every record, and Flush (which waits for every Pending) where the raw
// client waits for its PubAcks.
const jsAsync = -1

// logbusJS is logbus on its JetStream engine (module
// github.com/logbus/logbus/jetstream): a publishing broker and a consuming
// broker, each on a connection of its own, a topic of w.partitions
// partitions (codec.String keys, codec.RawBytes values, retention far
// beyond the run so Block never waits), and a group of one consumer whose
// handler returns the sink's error; a retry waits 5ms, as the raw
// client's Nak does. With batch 1 it publishes with Publish, which waits
// for each record's PubAck; with jsAsync, with PublishAsync, Flush waiting
// for every Pending (the default in-flight bound, 4096, as the raw
// client's); otherwise with PublishBatch, batch records at a time, whose
// PubAcks are awaited together.
func logbusJS(batch int) jsImpl {
	return func(b *testing.B, w jsWork, sink *jsSink) jsClient {
		env, err := startNATS(true)
		if err != nil {
			b.Fatal(err)
		}
		storage := ljs.FileStorage
		if w.storage == jetstream.MemoryStorage {
			storage = ljs.MemoryStorage
		}
		var brokers []*pubsub.Broker
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for _, br := range brokers {
				if err := br.Close(ctx); err != nil {
					b.Error(err)
				}
			}
			env.close()
		})
		open := func(opts ...pubsub.BrokerOption) *pubsub.Topic[string, []byte] {
			nc, err := env.connect()
			if err != nil {
				b.Fatal(err)
			}
			eng, err := ljs.Connect(nc, ljs.WithStorage(storage))
			if err != nil {
				b.Fatal(err)
			}
			br := pubsub.NewBroker(append(opts, pubsub.WithEngine(eng))...)
			if err := br.Err(); err != nil {
				b.Fatal(err)
			}
			brokers = append(brokers, br)
			t, err := pubsub.NewTopic(br, "bench", codec.String(), codec.RawBytes(), pubsub.WithPartitions(w.partitions),
				pubsub.WithRetention(pubsub.Retention{MaxMessages: 1 << 20}))
			if err != nil {
				b.Fatal(err)
			}
			return t
		}
		owned := &ownsAll{member: "m1", partitions: w.partitions, done: make(chan struct{})}
		pub, sub := open(), open(pubsub.WithHooks(owned))
		g, err := sub.Subscribe("g", "m1", pubsub.HandlerFunc[[]byte](func(_ context.Context, msg pubsub.Message[[]byte]) error {
			return sink.handle(msg.Value, msg.Attempt)
		}), pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: jsFaultDelay, Multiplier: 1, MaxDelay: jsFaultDelay}))
		if err != nil {
			b.Fatal(err)
		}
		// The group's member must own every partition before the clock
		// starts: membership is the engine's, decided in a heartbeat, and
		// reported by its rebalance event.
		select {
		case <-owned.done:
		case <-time.After(30 * time.Second):
			b.Fatalf("the consumer owns %v after 30s", g.Assignment())
		}

		ctx := context.Background()
		c := jsClient{flush: func() error { return nil },
			pause: func() error { return g.Pause(ctx) }, resume: func() error { return g.Resume(ctx) }}
		if batch == 1 {
			c.publish = func(key string, payload []byte) error {
				_, err := pub.Publish(ctx, key, payload)
				return err
			}
			return c
		}
		if batch == jsAsync {
			c.publish = func(key string, payload []byte) error {
				pub.PublishAsync(ctx, key, payload)
				return nil
			}
			c.flush = func() error { return pub.Flush(ctx) }
			return c
		}
		entries := make([]pubsub.Entry[string, []byte], 0, batch)
		flush := func() error {
			if len(entries) == 0 {
				return nil
			}
			_, err := pub.PublishBatch(ctx, entries)
			entries = entries[:0]
			return err
		}
		c.flush = flush
		c.publish = func(key string, payload []byte) error {
			entries = append(entries, pubsub.Entry[string, []byte]{Key: key, Value: payload})
			if len(entries) == batch {
				return flush()
			}
			return nil
		}
		return c
	}
}

// rawMode is how the raw client consumes and acks. The first is the
// baseline; the others take, one at a time, the steps the engine takes, to
// show what each costs.
type rawMode struct {
	fetch     bool // Fetch(1) per record in a loop, instead of Consume
	doubleAck bool // DoubleAck (waits for the server's reply), instead of Ack
}

func (m rawMode) String() string {
	s := "raw"
	if m.fetch {
		s += "-fetch1"
	}
	if m.doubleAck {
		s += "-doubleack"
	}
	return s
}

// rawJS is the raw nats.go JetStream client: stream bench_p<i> on subject
// bench.<i>, durable consumer g_p<i>, consumed with Consume (or a loop of
// Fetch(1)); msg.Ack (or DoubleAck) after the handler, NakWithDelay on a
// fault.
func rawJS(mode rawMode) jsImpl {
	return func(b *testing.B, w jsWork, sink *jsSink) jsClient {
		return rawJSRun(b, w, sink, mode)
	}
}

func rawJSRun(b *testing.B, w jsWork, sink *jsSink, mode rawMode) jsClient {
	env, err := startNATS(true)
	if err != nil {
		b.Fatal(err)
	}
	var ccs []jetstream.ConsumeContext
	stop := make(chan struct{})
	var fetchers sync.WaitGroup
	b.Cleanup(func() {
		for _, cc := range ccs {
			cc.Stop()
			<-cc.Closed()
		}
		close(stop)
		fetchers.Wait()
		env.close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	pubConn, err := env.connect()
	if err != nil {
		b.Fatal(err)
	}
	var pubErrs atomic.Int64
	js, err := jetstream.New(pubConn, jetstream.WithPublishAsyncMaxPending(4096),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { pubErrs.Add(1) }))
	if err != nil {
		b.Fatal(err)
	}
	subConn, err := env.connect()
	if err != nil {
		b.Fatal(err)
	}
	cjs, err := jetstream.New(subConn)
	if err != nil {
		b.Fatal(err)
	}
	handle := func(m jetstream.Msg) {
		// The delivery count, as the engine reads it for Message.Attempt.
		md, err := m.Metadata()
		if err != nil {
			b.Error(err)
			return
		}
		attempt := int(md.NumDelivered)
		if err := sink.handle(m.Data(), attempt); err != nil {
			m.NakWithDelay(jsFaultDelay)
			return
		}
		if mode.doubleAck {
			m.DoubleAck(context.Background())
		} else {
			m.Ack()
		}
	}
	for p := range w.partitions {
		stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
			Name: "bench_p" + strconv.Itoa(p), Subjects: []string{subject(p)}, Storage: w.storage})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: "g_p" + strconv.Itoa(p), AckPolicy: jetstream.AckExplicitPolicy,
			DeliverPolicy: jetstream.DeliverAllPolicy, MaxAckPending: w.inflight, AckWait: 30 * time.Second,
		}); err != nil {
			b.Fatal(err)
		}
		cons, err := cjs.Consumer(ctx, "bench_p"+strconv.Itoa(p), "g_p"+strconv.Itoa(p))
		if err != nil {
			b.Fatal(err)
		}
		if mode.fetch {
			fetchers.Add(1)
			go func() { // exits at cleanup, within one FetchMaxWait
				defer fetchers.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					batch, err := cons.Fetch(1, jetstream.FetchMaxWait(250*time.Millisecond))
					if err != nil {
						continue
					}
					for m := range batch.Messages() {
						handle(m)
					}
				}
			}()
			continue
		}
		cc, err := cons.Consume(handle)
		if err != nil {
			b.Fatal(err)
		}
		ccs = append(ccs, cc)
	}
	// With 4096 PubAcks outstanding, a publish waits for room, by default
	// for 200ms only, then fails: too short on a loaded two-core machine.
	stall := jetstream.WithStallWait(jsTimeout)
	publish := func(key string, payload []byte) error {
		p := jsPartition(key, w.partitions)
		msg := &nats.Msg{Subject: subject(p), Data: payload, Header: nats.Header{"Lb-Key": []string{key}}}
		_, err := js.PublishMsgAsync(msg, stall)
		return err
	}
	flush := func() error {
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(jsTimeout):
			return fmt.Errorf("PubAcks still pending after %v", jsTimeout)
		}
		if n := pubErrs.Load(); n > 0 {
			return fmt.Errorf("%d async publishes failed", n)
		}
		return nil
	}
	// Pause and resume the partitions' consumers on the server, as the
	// engine's Pause and Resume do.
	pauseAll := func(resume bool) error {
		pctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for p := range w.partitions {
			stream, consumer := "bench_p"+strconv.Itoa(p), "g_p"+strconv.Itoa(p)
			var err error
			if resume {
				_, err = js.ResumeConsumer(pctx, stream, consumer)
			} else {
				_, err = js.PauseConsumer(pctx, stream, consumer, time.Now().Add(time.Hour))
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	return jsClient{publish: publish, flush: flush,
		pause: func() error { return pauseAll(false) }, resume: func() error { return pauseAll(true) }}
}

// ownsAll is a rebalance hook that closes done once member owns every
// partition of the group.
type ownsAll struct {
	member     string
	partitions int
	once       sync.Once
	done       chan struct{}
}

func (o *ownsAll) OnRebalance(e pubsub.RebalanceEvent) {
	if len(e.After[o.member]) == o.partitions {
		o.once.Do(func() { close(o.done) })
	}
}
