package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// storedValues reads every record of topic's partitions from the server,
// on a connection of its own: the values by partition, by offset. The
// topic must retain every record.
func storedValues(t *testing.T, nc *nats.Conn, e *eng, topic string, partitions int) [][]string {
	t.Helper()
	jsc, err := natsjs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]string, partitions)
	for p := range partitions {
		s, err := jsc.Stream(t.Context(), e.names.stream(topic, p))
		if err != nil {
			t.Fatal(err)
		}
		if first := s.CachedInfo().State.FirstSeq; first > 1 {
			t.Fatalf("partition %d starts at sequence %d: the test needs every record retained", p, first)
		}
		for seq := uint64(1); seq <= s.CachedInfo().State.LastSeq; seq++ {
			m, err := s.GetMsg(t.Context(), seq)
			if err != nil {
				t.Fatalf("partition %d sequence %d: %v", p, seq, err)
			}
			out[p] = append(out[p], string(m.Data))
		}
	}
	return out
}

// keepAll is a retention that keeps every record of the tests.
var keepAll = pubsub.WithRetention(pubsub.Retention{MaxMessages: 1 << 16})

// issued is a record PublishAsync issued, and its Pending.
type issued struct {
	value string
	pd    *pubsub.Pending
}

// checkAsyncOutcomes checks every Pending against what the server stored:
// each resolved; none stored twice; a record reported stored is stored at
// its position; one reported not stored (an error without
// ErrOutcomeUnknown) is not stored; and each partition stored its records
// in the order they were issued. It returns how many resolved stored, not
// stored and unknown.
func checkAsyncOutcomes(t *testing.T, recs []issued, stored [][]string) (ok, failed, unknown int) {
	t.Helper()
	where := map[string]pubsub.Position{}
	for p, vs := range stored {
		for i, v := range vs {
			if prev, dup := where[v]; dup {
				t.Errorf("%s is stored twice: at %v and at partition %d offset %d", v, prev, p, i)
			}
			where[v] = pubsub.Position{Partition: p, Offset: int64(i)}
		}
	}
	order := map[string]int{}
	for i, r := range recs {
		order[r.value] = i
		select {
		case <-r.pd.Done():
		default:
			t.Fatalf("%s unresolved", r.value)
		}
		pos, err := r.pd.Wait(t.Context())
		at, isStored := where[r.value]
		switch {
		case err == nil:
			ok++
			if !isStored || at != pos {
				t.Errorf("%s reported stored at %v; the server has it at %v (stored: %v)", r.value, pos, at, isStored)
			}
		case errors.Is(err, pubsub.ErrOutcomeUnknown):
			unknown++
		default:
			failed++
			if isStored {
				t.Errorf("%s reported not stored (%v), but the server has it at %v", r.value, err, at)
			}
		}
	}
	for p, vs := range stored {
		for i := 1; i < len(vs); i++ {
			if order[vs[i]] < order[vs[i-1]] {
				t.Errorf("partition %d stored %s after %s, issued later", p, vs[i], vs[i-1])
			}
		}
	}
	return ok, failed, unknown
}

// eventsOnRestartable opens a topic "events" of two partitions keeping
// every record, on a broker of its own whose engine has the request
// timeout given and stores on file, connected by nc to a server that can
// be stopped and started again.
func eventsOnRestartable(t *testing.T, timeout time.Duration) (*restartable, *nats.Conn, *eng, *pubsub.Topic[string, string]) {
	t.Helper()
	srv := newRestartable(t)
	nc := srv.connect(t)
	js, err := Connect(nc, fileOptions(WithRequestTimeout(timeout))...)
	if err != nil {
		t.Fatal(err)
	}
	b, e := brokerWithEngine(t, js)
	topic, err := pubsub.NewTopic(b, "events", codec.String(), codec.String(), pubsub.WithPartitions(2), keepAll)
	if err != nil {
		t.Fatal(err)
	}
	return srv, nc, e, topic
}

// A server stopped with records in flight, and started again within the
// engine's bound: every Pending resolves, every record is stored once, in
// the order it was issued, where its Pending says.
func TestPublishAsyncAcrossAServerRestart(t *testing.T) {
	srv, nc, e, topic := eventsOnRestartable(t, 3*time.Second)
	ctx := t.Context()
	const n = 3000
	var recs []issued
	for i := range n {
		if i == n/3 {
			srv.stopSeen(t, nc) // the outage: two thirds of the records are issued during it
		}
		v := fmt.Sprintf("r%04d", i)
		recs = append(recs, issued{v, topic.PublishAsync(ctx, fmt.Sprint("k", i%8), v)})
	}
	srv.start()
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := topic.Flush(fctx)
	if err != nil && errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush: %v", err)
	}
	ok, failed, unknown := checkAsyncOutcomes(t, recs, storedValues(t, srv.connect(t), e, "events", 2))
	if ok != n {
		t.Errorf("%d stored, %d not stored, %d unknown (Flush: %v); want all %d stored: the server came back within the bound",
			ok, failed, unknown, err, n)
	}
}

// A server stopped with records in flight, and back only after the
// engine's bound: every Pending resolves within it, saying stored, not
// stored (ErrAborted behind the first failure) or unknown, and what each
// says stored is stored once, in order.
func TestPublishAsyncWhenTheServerStaysDown(t *testing.T) {
	srv, _, e, topic := eventsOnRestartable(t, 500*time.Millisecond)
	ctx := t.Context()
	const n = 2000
	var recs []issued
	for i := range n {
		if i == n/2 {
			// Some stored, and records in flight behind them.
			if _, err := recs[n/4].pd.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			srv.stop()
		}
		v := fmt.Sprintf("r%04d", i)
		recs = append(recs, issued{v, topic.PublishAsync(ctx, fmt.Sprint("k", i%8), v)})
	}
	began := time.Now()
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err := topic.Flush(fctx)
	took := time.Since(began)
	if errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, pubsub.ErrUnavailable) {
		t.Fatalf("Flush after %v: %v; want the records resolved, failed wrapping ErrUnavailable", took, err)
	}
	var aborted int
	for _, r := range recs {
		if _, err := r.pd.Wait(ctx); errors.Is(err, pubsub.ErrAborted) {
			aborted++
		}
	}
	srv.start()
	ok, failed, unknown := checkAsyncOutcomes(t, recs, storedValues(t, srv.connect(t), e, "events", 2))
	if ok == 0 || aborted == 0 || failed < aborted {
		t.Errorf("%d stored, %d not stored (%d of them aborted), %d unknown; want some stored, and the records held behind the first failure aborted, not stored",
			ok, failed, aborted, unknown)
	}
	t.Logf("resolved in %v: %d stored, %d not stored (%d of them aborted), %d unknown; Flush: %v", took, ok, failed, aborted, unknown, err)
}

// Answers lost on the way back (the connection stays up): the records
// reached the server, and their Pendings say the outcome is unknown, never
// that they were not stored.
func TestPublishAsyncWhoseAnswersAreLostSaysUnknown(t *testing.T) {
	srv := newRestartable(t)
	h := newBlackhole(t, strings.TrimPrefix(srv.url(), "nats://"))
	nc, err := nats.Connect(h.url(), nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := Connect(nc, testOptions(WithRequestTimeout(300*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	b, e := brokerWithEngine(t, js)
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := topic.PublishAsync(ctx, "k", "answered").Wait(ctx); err != nil {
		t.Fatal(err)
	}
	close(h.hold)
	var recs []issued
	for i := range 5 {
		v := fmt.Sprint("unanswered", i)
		recs = append(recs, issued{v, topic.PublishAsync(ctx, "k", v)})
	}
	if err := topic.Flush(ctx); !errors.Is(err, pubsub.ErrOutcomeUnknown) {
		t.Errorf("Flush: %v, want ErrOutcomeUnknown", err)
	}
	for _, r := range recs {
		if _, err := r.pd.Wait(ctx); !errors.Is(err, pubsub.ErrOutcomeUnknown) || strings.Contains(err.Error(), "not stored") {
			t.Errorf("%s: %v; want ErrOutcomeUnknown, not a claim that it was not stored", r.value, err)
		}
	}
	stored := storedValues(t, srv.connect(t), e, "orders", 1)
	if got := len(stored[0]); got != 6 {
		t.Errorf("the server stored %d records, want 6: the unanswered ones reached it", got)
	}
}

// The recovery's question: a record sent again under its message ID,
// expecting a last message ID no record has, is answered with its
// sequence when it was stored, and refused, storing nothing, when it was
// not.
func TestProbeTellsStoredFromNotStored(t *testing.T) {
	b, e := brokerWithEngine(t, testServer.Engine(testOptions()...))
	ctx := t.Context()
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := topic.Publish(ctx, "k", "first"); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	et := e.topics["orders"]
	e.mu.Unlock()
	m, err := et.message(0, &engine.Record{Key: []byte("k"), Value: []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := et.probe(ctx, 0, m); ok || err != nil {
		t.Errorf("probe of a record never sent: stored %v, %v; want not stored", ok, err)
	}
	if got := topic.Stats().Published; got != 1 {
		t.Errorf("published %d after the probe, want 1: a probe stores nothing", got)
	}
	off, err := et.publish(ctx, 0, m)
	if err != nil {
		t.Fatal(err)
	}
	if seq, ok, err := et.probe(ctx, 0, m); !ok || err != nil || int64(seq)-1 != off {
		t.Errorf("probe of a stored record: stored %v at sequence %d, %v; want stored at offset %d", ok, seq, err, off)
	}
	if got := topic.Stats().Published; got != 2 {
		t.Errorf("published %d, want 2", got)
	}
}

// ackSeq reads the server's PubAck of a stored record, and leaves every
// other answer to the JSON decoder.
func TestAckSeq(t *testing.T) {
	for _, c := range []struct {
		data string
		seq  uint64
		ok   bool
	}{
		{`{"stream":"logbus_p0","seq":42}`, 42, true},
		{`{"stream":"s","seq":7,"duplicate": true}`, 7, true},
		{`{"stream":"s","seq":9223372036854775807}`, 9223372036854775807, true},
		{`{"stream":"s","seq":18446744073709551615}`, 0, false}, // 20 digits: the decoder's
		{`{"stream":"s","domain":"d","seq":7}`, 0, false},
		{`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"},"stream":"s","seq":0}`, 0, false},
		{`{"stream":"s","seq":0}`, 0, false},
		{`{"stream":"s","seq":}`, 0, false},
		{`{"stream":"s","seq":12x}`, 0, false},
		{``, 0, false},
	} {
		seq, ok := ackSeq([]byte(c.data))
		if seq != c.seq || ok != c.ok {
			t.Errorf("ackSeq(%s) = %d, %v; want %d, %v", c.data, seq, ok, c.seq, c.ok)
		}
	}
}

// A Block partition that a paused group keeps full: the first record that
// does not fit fails with ErrBackpressure after BlockTimeout, and the
// records sent behind it, refused too, fail with ErrAborted wrapping it,
// at once; a record published once the group resumed is stored afresh.
func TestPublishAsyncIntoAFullBlockPartitionAbortsTheRest(t *testing.T) {
	b := newBroker(t)
	ctx := t.Context()
	topic, err := pubsub.NewTopic(b, "jobs", codec.String(), codec.String(),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, BlockTimeout: 50 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	g, err := topic.Subscribe("held", "h1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	var pds []*pubsub.Pending
	for i := range 6 {
		pds = append(pds, topic.PublishValueAsync(ctx, fmt.Sprint("j", i)))
	}
	if err := topic.Flush(ctx); !errors.Is(err, pubsub.ErrBackpressure) || !strings.Contains(err.Error(), "4 records failed") {
		t.Errorf("Flush: %v; want 4 records failed, wrapping ErrBackpressure", err)
	}
	for i, pd := range pds {
		pos, err := pd.Wait(ctx)
		switch {
		case i < 2 && (err != nil || pos.Offset != int64(i)):
			t.Errorf("j%d: %v, %v; want stored at offset %d", i, pos, err, i)
		case i == 2 && (!errors.Is(err, pubsub.ErrBackpressure) || errors.Is(err, pubsub.ErrAborted)):
			t.Errorf("j2, the first that does not fit: %v; want ErrBackpressure, not ErrAborted", err)
		case i > 2 && (!errors.Is(err, pubsub.ErrAborted) || !errors.Is(err, pubsub.ErrBackpressure)):
			t.Errorf("j%d, behind it: %v; want ErrAborted wrapping ErrBackpressure", i, err)
		}
	}
	if err := g.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if pos, err := topic.PublishValueAsync(ctx, "afresh").Wait(ctx); err != nil || pos.Offset != 2 {
		t.Errorf("a record published after the failures resolved: %v, %v; want stored at offset 2", pos, err)
	}
}

// sendRaw sends messages through partition p's pipe as AppendAsync would,
// and returns their outcomes, in the order their done was called.
func sendRaw(t *testing.T, et *topic, p int, msgs ...*nats.Msg) []error {
	t.Helper()
	if err := et.e.replies(); err != nil {
		t.Fatal(err)
	}
	type result struct {
		i   int
		off int64
		err error
	}
	results := make(chan result, len(msgs))
	pp := et.pipes[p]
	pp.mu.Lock()
	for i, m := range msgs {
		pp.sendLocked(&outgoing{msg: m, done: func(off int64, err error) { results <- result{i, off, err} }})
	}
	pp.advanceLocked()
	pp.mu.Unlock()
	errs := make([]error, len(msgs))
	for want := range msgs {
		select {
		case r := <-results:
			if r.i != want {
				t.Fatalf("record %d resolved before record %d", r.i, want)
			}
			errs[r.i] = r.err
		case <-time.After(30 * time.Second):
			t.Fatalf("record %d unresolved after 30s", want)
		}
	}
	return errs
}

// The server refuses a record and stores the one sent behind it (here a
// record expecting a last sequence the stream does not have, then a plain
// one): the gap is reported as it is, and the refused record is not sent
// again, which would store it after the later one.
func TestPublishAsyncReportsAGapAsItIs(t *testing.T) {
	b, e := brokerWithEngine(t, testServer.Engine(testOptions()...))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	et := e.topics["orders"]
	e.mu.Unlock()
	refused, err := et.message(0, &engine.Record{Key: []byte("k"), Value: []byte("refused")})
	if err != nil {
		t.Fatal(err)
	}
	refused.Header.Set(natsjs.ExpectedLastSeqHeader, "999")
	behind, err := et.message(0, &engine.Record{Key: []byte("k"), Value: []byte("behind")})
	if err != nil {
		t.Fatal(err)
	}
	errs := sendRaw(t, et, 0, refused, behind)
	if errs[0] == nil || errors.Is(errs[0], engine.ErrOutcomeUnknown) || !strings.Contains(errs[0].Error(), "a record after it was stored") {
		t.Errorf("the refused record: %v; want not stored, saying a record after it was stored", errs[0])
	}
	if errs[1] != nil {
		t.Errorf("the record behind it: %v; want stored", errs[1])
	}
	nc, err := testServer.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := storedValues(t, nc, e, "orders", 1)[0]; len(got) != 1 || got[0] != "behind" {
		t.Errorf("the server stored %q, want [behind]: the refused record was not sent again", got)
	}
	if got := topic.Stats().Published; got != 1 {
		t.Errorf("published %d, want 1", got)
	}
}

// A record the server refuses, and refuses again when the pipe sends it
// alone, fails with its cause; the records sent behind it, refused too,
// fail with ErrAborted; nothing is stored, and the next record is.
func TestPublishAsyncAbortsWhatFollowsARefusal(t *testing.T) {
	b, e := brokerWithEngine(t, testServer.Engine(testOptions()...))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	et := e.topics["orders"]
	e.mu.Unlock()
	var msgs []*nats.Msg
	for i := range 3 {
		m, err := et.message(0, &engine.Record{Key: []byte("k"), Value: []byte(fmt.Sprint("v", i))})
		if err != nil {
			t.Fatal(err)
		}
		m.Header.Set(natsjs.ExpectedLastSeqHeader, "999") // refused, every time
		msgs = append(msgs, m)
	}
	errs := sendRaw(t, et, 0, msgs...)
	if errs[0] == nil || errors.Is(errs[0], engine.ErrAborted) {
		t.Errorf("the first refused record: %v; want its own cause", errs[0])
	}
	for i, err := range errs[1:] {
		if !errors.Is(err, engine.ErrAborted) || errors.Is(err, engine.ErrOutcomeUnknown) {
			t.Errorf("record %d behind it: %v; want ErrAborted, and not an unknown outcome", i+1, err)
		}
	}
	if pos, err := topic.PublishValueAsync(t.Context(), "next").Wait(t.Context()); err != nil || pos.Offset != 0 {
		t.Errorf("the next record: %v, %v; want stored at offset 0", pos, err)
	}
}
