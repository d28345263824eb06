package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

func asyncCases() []confCase {
	return []confCase{
		{name: "PublishAsync stores records at dense positions, those Publish would give, in call order per key", run: func(c *conf) {
			b, topic := c.brokerTopic("orders", pubsub.WithPartitions(3))
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "g", "c1", rec)
			const n = 60
			keys := []string{"alice", "bob", "carol", "dave", "erin"}
			var pds []*pubsub.Pending
			want := make([]pubsub.Position, n)
			next := map[int]int64{}
			for i := range n {
				key := keys[i%len(keys)]
				p := keyPartition(key, 3)
				want[i] = pubsub.Position{Partition: p, Offset: next[p]}
				next[p]++
				if i%10 == 9 { // a synchronous Publish among them takes the next offset as well
					if pos := publish(c, topic, key, fmt.Sprintf("%s-%d", key, i)); pos != want[i] {
						c.Errorf("Publish of record %d: got %v, want %v", i, pos, want[i])
					}
					pds = append(pds, nil)
					continue
				}
				pds = append(pds, topic.PublishAsync(c.ctx(), key, fmt.Sprintf("%s-%d", key, i)))
			}
			if err := topic.Flush(c.ctx()); err != nil {
				c.Fatalf("Flush: %v", err)
			}
			for i, pd := range pds {
				if pd == nil {
					continue
				}
				pos, err := pd.Wait(c.ctx())
				if err != nil || pos != want[i] {
					c.Errorf("record %d: got %v, %v; want %v", i, pos, err, want[i])
				}
			}
			c.drain(b)
			got := map[string][]string{}
			for _, v := range rec.Values() {
				key, _, _ := strings.Cut(v, "-")
				got[key] = append(got[key], v)
			}
			for _, key := range keys {
				var wantKey []string
				for i := range n {
					if keys[i%len(keys)] == key {
						wantKey = append(wantKey, fmt.Sprintf("%s-%d", key, i))
					}
				}
				if !slices.Equal(got[key], wantKey) {
					c.Errorf("key %s delivered %q, want %q (call order)", key, got[key], wantKey)
				}
			}
		}},
		{name: "Flush is nil after success, and otherwise says how many failed and wraps the first failure, once", run: func(c *conf) {
			b := c.broker()
			topic := newTopic(c, b, "t", pickyStrings(), pickyStrings())
			for _, v := range []string{"a", "unencodable", "b", "unencodable", "c"} {
				topic.PublishValueAsync(c.ctx(), v)
			}
			err := topic.Flush(c.ctx())
			c.wantIs("Flush after two unencodable values", err, pubsub.ErrInvalid, errEncode)
			if !contains(err, "2 records failed") {
				c.Errorf("Flush: got %v, want it to say 2 records failed", err)
			}
			if err := topic.Flush(c.ctx()); err != nil {
				c.Errorf("Flush again: got %v, want nil: each failure is reported once", err)
			}
			topic.PublishValueAsync(c.ctx(), "d")
			if err := topic.Flush(c.ctx()); err != nil {
				c.Errorf("Flush after a stored record: got %v, want nil", err)
			}
			if _, end, _ := topic.Offsets(0); end != 4 {
				c.Errorf("end offset %d, want 4: the failed records took none", end)
			}
		}},
		{name: "a Block partition that stays full fails the records behind the first failure too, each wrapping its cause", run: func(c *conf) {
			asyncPrefixCase(c, false)
		}},
		{name: "what a full Block partition stored of asynchronous records is a prefix of them", needs: engine.GaplessAsync, run: func(c *conf) {
			asyncPrefixCase(c, true)
		}},
		{name: "Drain and Close wait for the records PublishAsync has in flight", run: func(c *conf) {
			b, topic := c.brokerTopic("t", pubsub.WithPartitions(2))
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "g", "c1", rec)
			for i := range 20 {
				topic.PublishAsync(c.ctx(), fmt.Sprint("k", i%4), fmt.Sprint(i))
			}
			c.drain(b) // no Flush: Drain waits for them itself
			if got := len(rec.Values()); got != 20 {
				c.Errorf("delivered %d records when Drain returned, want 20", got)
			}
			var pds []*pubsub.Pending
			for i := range 20 {
				pds = append(pds, topic.PublishAsync(c.ctx(), fmt.Sprint("k", i%4), fmt.Sprint(20+i)))
			}
			if err := b.Close(c.ctx()); err != nil {
				c.Fatalf("Close: %v", err)
			}
			for i, pd := range pds {
				select {
				case <-pd.Done():
				default:
					c.Fatalf("record %d unresolved when Close returned", i)
				}
				if _, err := pd.Wait(c.ctx()); err != nil {
					c.Errorf("record %d: %v, want stored: Close does not refuse records in flight", i, err)
				}
			}
			if got := len(rec.Values()); got != 40 {
				c.Errorf("delivered %d records when Close returned, want 40", got)
			}
			_, err := topic.PublishValueAsync(c.ctx(), "late").Wait(c.ctx())
			c.wantIs("PublishAsync after Close", err, pubsub.ErrClosed)
		}},
		{name: "ctx bounds only admission and Wait's ctx only the wait: neither changes a record's fate", run: func(c *conf) {
			_, topic := c.brokerTopic("t")
			ctx, cancel := context.WithCancel(context.Background())
			pd := topic.PublishValueAsync(ctx, "admitted")
			cancel() // after admission: the record's fate is the engine's
			cancelled, stop := context.WithCancel(context.Background())
			stop()
			if _, err := pd.Wait(cancelled); err != nil && !errors.Is(err, context.Canceled) {
				c.Errorf("Wait with a cancelled ctx: got %v, want nil or ctx's error", err)
			}
			pos, err := pd.Wait(c.ctx())
			if err != nil || pos != (pubsub.Position{Partition: 0, Offset: 0}) {
				c.Errorf("Wait again: got %v, %v; want stored at offset 0", pos, err)
			}
			_, err = topic.PublishValueAsync(nil, "x").Wait(c.ctx()) //lint:ignore SA1012 a nil context is what is checked
			c.wantIs("PublishValueAsync with a nil ctx", err, pubsub.ErrInvalid)
			_, err = pd.Wait(nil) //lint:ignore SA1012 a nil context is what is checked
			c.wantIs("Wait with a nil ctx", err, pubsub.ErrInvalid)
			err = topic.Flush(nil) //lint:ignore SA1012 a nil context is what is checked
			c.wantIs("Flush with a nil ctx", err, pubsub.ErrInvalid)
		}},
		{name: "HookPublished sees every asynchronous record resolve, before its Pending does", run: func(c *conf) {
			hook := &resolvedHook{}
			b := c.broker(pubsub.WithHooks(hook))
			topic := c.topic(b, "t", pubsub.WithPartitions(2))
			var pds []*pubsub.Pending
			for i := range 10 {
				pds = append(pds, topic.PublishAsync(c.ctx(), fmt.Sprint("k", i), "v"))
			}
			for i, pd := range pds {
				pos, err := pd.Wait(c.ctx())
				if err != nil {
					c.Fatalf("record %d: %v", i, err)
				}
				if !hook.saw(pos) {
					c.Errorf("record %d at %v resolved before HookPublished saw it", i, pos)
				}
			}
			if got := hook.count(); got != 10 {
				c.Errorf("HookPublished called %d times, want 10", got)
			}
		}},
	}
}

// asyncPrefixCase fills a Block partition that a paused group holds, then
// publishes asynchronously into it: the records that fit are stored, the
// others fail, the first with its own cause (ErrBackpressure) and the
// others wrapping it (ErrAborted or their own), and a record published
// once the group resumed is stored afresh. strict checks the prefix rule
// exactly: no record is stored after one that failed.
func asyncPrefixCase(c *conf, strict bool) {
	b, topic := c.brokerTopic("jobs", pubsub.WithRetention(pubsub.Retention{MaxMessages: 3, BlockTimeout: shortWait}))
	rec := pubsubtest.NewRecorder[string]()
	g := subscribe(c, topic, "held", "h1", rec)
	if err := g.Pause(c.ctx()); err != nil {
		c.Fatalf("Pause: %v", err)
	}
	const n = 6
	var pds []*pubsub.Pending
	for i := range n {
		pds = append(pds, topic.PublishValueAsync(c.ctx(), fmt.Sprint("j", i)))
	}
	err := topic.Flush(c.ctx())
	c.wantIs("Flush", err, pubsub.ErrBackpressure)
	if errors.Is(err, pubsub.ErrAborted) {
		c.Errorf("Flush: got %v, want the first failure's own cause, not ErrAborted", err)
	}
	firstFailed := -1
	for i, pd := range pds {
		select {
		case <-pd.Done():
		default:
			c.Fatalf("record %d unresolved after Flush", i)
		}
		pos, err := pd.Wait(c.ctx())
		if again, err2 := pd.Wait(c.ctx()); again != pos || !errors.Is(err2, err) || !errors.Is(err, err2) {
			c.Errorf("record %d: Wait gave %v, %v, then %v, %v: a Pending resolves once", i, pos, err, again, err2)
		}
		switch {
		case err == nil && pos != (pubsub.Position{Partition: 0, Offset: int64(i)}):
			c.Errorf("record %d stored at %v, want offset %d: dense, in call order", i, pos, i)
		case err == nil && strict && firstFailed >= 0:
			c.Errorf("record %d stored at %v after record %d failed: not a prefix", i, pos, firstFailed)
		case err == nil:
		case firstFailed < 0:
			firstFailed = i
			c.wantIs(fmt.Sprintf("record %d, the first to fail", i), err, pubsub.ErrBackpressure)
			if errors.Is(err, pubsub.ErrAborted) {
				c.Errorf("record %d, the first to fail: got %v, want its own cause, not ErrAborted", i, err)
			}
		default:
			c.wantIs(fmt.Sprintf("record %d, behind the first failure", i), err, pubsub.ErrBackpressure)
		}
	}
	if firstFailed != 3 {
		c.Errorf("the first record to fail is %d, want 3: the partition holds 3", firstFailed)
	}
	if err := g.Resume(c.ctx()); err != nil {
		c.Fatalf("Resume: %v", err)
	}
	c.drain(b)
	pos, err := topic.PublishValueAsync(c.ctx(), "afresh").Wait(c.ctx())
	if err != nil || pos.Offset != 3 {
		c.Errorf("a record published after the failures resolved: got %v, %v; want stored at offset 3", pos, err)
	}
	c.drain(b)
	if got, want := rec.Values(), []string{"j0", "j1", "j2", "afresh"}; !slices.Equal(got, want) {
		c.Errorf("delivered %q, want %q", got, want)
	}
}

// resolvedHook is a HookPublished that remembers the positions it saw.
type resolvedHook struct {
	mu  sync.Mutex
	pos []pubsub.Position
}

func (h *resolvedHook) OnPublished(_ context.Context, _ *pubsub.PublishInfo, pos pubsub.Position, _ error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pos = append(h.pos, pos)
}

func (h *resolvedHook) saw(pos pubsub.Position) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Contains(h.pos, pos)
}

func (h *resolvedHook) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.pos)
}
