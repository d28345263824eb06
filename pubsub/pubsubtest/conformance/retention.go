package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

func retentionCases() []confCase {
	return []confCase{
		{name: "a full Block partition fails Publish with ErrBackpressure naming the group holding the oldest record, and appends nothing", run: func(c *conf) {
			b, topic := c.brokerTopic("jobs", pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, BlockTimeout: shortWait}))
			// "fast" subscribed first and commits everything, so naming the
			// first group rather than the slowest names the wrong one.
			fast := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "fast", "f1", fast)
			stuck := newGate(c, false)
			subscribe(c, topic, "stuck", "s1", stuck.handler())
			publishValue(c, topic, "j1")
			publishValue(c, topic, "j2")
			waitFor(c, fast, 2)
			c.wait("stuck's first delivery", stuck.entered)
			_, err := topic.PublishValue(c.ctx(), "j3")
			c.wantIs("PublishValue to a partition that stuck holds full", err, pubsub.ErrBackpressure)
			if !contains(err, `"stuck"`) || contains(err, `"fast"`) {
				c.Errorf("error %v: want it to name group \"stuck\", and not \"fast\"", err)
			}
			st := topic.Stats()
			if st.Published != 2 || st.Retained != 2 || st.Blocked != 1 || st.TimedOut != 1 {
				c.Errorf("stats: got %+v, want Published 2, Retained 2, Blocked 1, TimedOut 1", st)
			}
			c.accounted(st)
			stuck.open()
			c.drain(b)
		}},
		{name: "Block waits exactly BlockTimeout for the slowest group before ErrBackpressure", needs: engine.VirtualTime | engine.ExactBlock, run: func(c *conf) {
			b, topic := c.brokerTopic("jobs", pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, BlockTimeout: 50 * time.Millisecond}))
			stuck := newGate(c, false)
			subscribe(c, topic, "stuck", "s1", stuck.handler())
			publishValue(c, topic, "j1")
			start := time.Now()
			_, err := topic.PublishValue(c.ctx(), "j2")
			c.wantIs("PublishValue to a full partition", err, pubsub.ErrBackpressure)
			if waited := time.Since(start); waited != 50*time.Millisecond {
				c.Errorf("Publish waited %v, want the 50ms BlockTimeout", waited)
			}
			stuck.open()
			c.drain(b)
		}},
		{name: "a blocked Publish never waits past its context and then appends nothing", run: func(c *conf) {
			b, topic := c.brokerTopic("jobs", pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, BlockTimeout: failureBound}))
			stuck := newGate(c, false)
			subscribe(c, topic, "stuck", "s1", stuck.handler())
			publishValue(c, topic, "j1")
			_, err := topic.PublishValue(c.within(shortWait), "j2")
			c.wantIs("PublishValue with a context shorter than BlockTimeout", err, context.DeadlineExceeded)
			if errors.Is(err, pubsub.ErrBackpressure) {
				c.Errorf("PublishValue: got %v, want the context's error, not ErrBackpressure", err)
			}
			if st := topic.Stats(); st.Published != 1 || st.Blocked != 1 || st.TimedOut != 0 {
				c.Errorf("stats: got %+v, want Published 1, Blocked 1, TimedOut 0", st)
			}
			stuck.open()
			c.drain(b)
			if pos := publishValue(c, topic, "j3"); pos.Offset != 1 {
				c.Errorf("the next record: got offset %d, want 1 (the failed publish took none)", pos.Offset)
			}
			c.drain(b)
		}},
		{name: "a Publish blocked on a full partition gets room as soon as the slowest group commits", needs: engine.ReclaimOnCommit, run: func(c *conf) {
			b, topic := c.brokerTopic("jobs", pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, BlockTimeout: failureBound}))
			stuck := newGate(c, false)
			subscribe(c, topic, "stuck", "s1", stuck.handler())
			publishValue(c, topic, "j1")
			published := publishLater(c, topic, "j2")
			c.settle()
			select {
			case r := <-published:
				c.Fatalf("Publish to a full partition returned %+v before the group committed, want it to wait", r)
			default:
			}
			stuck.open()
			r := <-published
			if r.err != nil || r.pos.Offset != 1 {
				c.Fatalf("the blocked Publish: got %+v, want offset 1 and no error", r)
			}
			c.drain(b)
			st := topic.Stats()
			if st.Reclaimed != 1 || st.Retained != 1 || st.TimedOut != 0 {
				c.Errorf("stats: got %+v, want Reclaimed 1, Retained 1, TimedOut 0", st)
			}
			c.accounted(st)
		}},
		{name: "a full partition frees the records every group has committed, and a new group starts at the oldest one retained", needs: engine.ReclaimOnCommit, run: func(c *conf) {
			b, topic := c.brokerTopic("jobs", pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, BlockTimeout: failureBound}))
			subscribe(c, topic, "one", "c1", pubsubtest.NewRecorder[string]())
			subscribe(c, topic, "two", "c1", pubsubtest.NewRecorder[string]())
			for i := range 10 {
				publishValue(c, topic, fmt.Sprint("j", i))
			}
			c.drain(b)
			st := topic.Stats()
			if st.Published != 10 || st.Retained != 2 || st.Reclaimed != 8 || st.Dropped != 0 || st.TimedOut != 0 {
				c.Errorf("stats: got %+v, want Published 10, Retained 2, Reclaimed 8, nothing dropped or timed out", st)
			}
			c.accounted(st)
			late, g := subscribeLate(c, b, topic)
			if got, want := late.Values(), []string{"j8", "j9"}; !slices.Equal(got, want) {
				c.Errorf("a group created now got %q, want %q", got, want)
			}
			if s := g.Stats(); s.Skipped != 0 {
				c.Errorf("the new group skipped %d, want 0: what was freed before it existed is not its loss", s.Skipped)
			}
		}},
		{name: "a full partition that no group reads trims its oldest record instead of blocking, and a late group reads the newest", run: func(c *conf) {
			b, topic := c.brokerTopic("events", pubsub.WithRetention(pubsub.Retention{MaxMessages: 4, OnFull: pubsub.Block, BlockTimeout: failureBound}))
			for i := range 10 {
				if _, err := topic.PublishValue(c.ctx(), fmt.Sprint("e", i)); err != nil {
					c.Fatalf("PublishValue(e%d) with no group: got %v, want nil", i, err)
				}
			}
			st := topic.Stats()
			if st.Published != 10 || st.Retained != 4 || st.Dropped != 6 || st.Blocked != 0 || st.TimedOut != 0 {
				c.Errorf("stats: got %+v, want Published 10, Retained 4, Dropped 6, none Blocked or TimedOut", st)
			}
			c.accounted(st)
			late, g := subscribeLate(c, b, topic)
			var offsets []int64
			for _, m := range late.Messages() {
				offsets = append(offsets, m.Offset)
			}
			if want := []int64{6, 7, 8, 9}; !slices.Equal(offsets, want) {
				c.Errorf("the late group read offsets %v, want %v", offsets, want)
			}
			if s := g.Stats(); s.Skipped != 0 {
				c.Errorf("the late group skipped %d, want 0", s.Skipped)
			}
		}},
		{name: "DropOldest evicts the oldest record without waiting, counted as Dropped, and as Skipped by a group that had not read it", needs: engine.DropsOldest, run: func(c *conf) {
			b, topic := c.brokerTopic("orders", pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, OnFull: pubsub.DropOldest, BlockTimeout: failureBound}))
			rec := pubsubtest.NewRecorder[string]()
			entered, release := make(chan struct{}), make(chan struct{})
			c.Cleanup(func() {
				select {
				case <-release:
				default:
					close(release)
				}
			})
			rec.FailWith(func(m pubsub.Message[string]) error {
				if m.Value == "v0" {
					close(entered)
					<-release
				}
				return nil
			})
			g := subscribe(c, topic, "slow", "s1", rec)
			publishValue(c, topic, "v0")
			c.wait("the delivery of v0", entered)
			for _, v := range []string{"v1", "v2", "v3", "v4"} {
				publishValue(c, topic, v) // would fail after failureBound if it waited
			}
			st := topic.Stats()
			if st.Published != 5 || st.Retained != 2 || st.Dropped != 3 || st.Blocked != 0 || st.TimedOut != 0 {
				c.Errorf("stats: got %+v, want Published 5, Retained 2, Dropped 3, none Blocked", st)
			}
			c.accounted(st)
			close(release)
			c.drain(b)
			if got, want := rec.Values(), []string{"v0", "v3", "v4"}; !slices.Equal(got, want) {
				c.Errorf("delivered %q, want %q (v1 and v2 were dropped unread)", got, want)
			}
			if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 3, Skipped: 2}); got != want {
				c.Errorf("group stats: got %+v, want %+v", got, want)
			}
		}},
		{name: "MaxAge trims records older than it, counted as Expired, and as Skipped by a group that had not read them", needs: engine.MaxAge | engine.InjectedClock, run: func(c *conf) {
			clock, b, topic := c.clockedBrokerTopic("orders", pubsub.WithRetention(pubsub.Retention{MaxAge: time.Minute}))
			rec := pubsubtest.NewRecorder[string]()
			g := subscribe(c, topic, "billing", "b1", rec)
			if err := g.Pause(c.ctx()); err != nil {
				c.Fatalf("Pause: %v", err)
			}
			publishValue(c, topic, "old-1")
			publishValue(c, topic, "old-2")
			clock.Advance(time.Minute) // exactly MaxAge old: kept
			publishValue(c, topic, "young")
			if st := topic.Stats(); st.Expired != 0 || st.Retained != 3 {
				c.Errorf("stats with the oldest exactly MaxAge old: got %+v, want Expired 0, Retained 3", st)
			}
			clock.Advance(time.Second) // the two old ones are now older than MaxAge
			publishValue(c, topic, "new")
			st := topic.Stats()
			if st.Expired != 2 || st.Retained != 2 {
				c.Errorf("stats: got %+v, want Expired 2, Retained 2", st)
			}
			c.accounted(st)
			if err := g.Resume(c.ctx()); err != nil {
				c.Fatalf("Resume: %v", err)
			}
			c.drain(b)
			if got, want := rec.Values(), []string{"young", "new"}; !slices.Equal(got, want) {
				c.Errorf("delivered %q, want %q", got, want)
			}
			if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 2, Skipped: 2}); got != want {
				c.Errorf("group stats: got %+v, want %+v", got, want)
			}
		}},
		{name: "a Publish blocked on a full partition gets room when the oldest record expires", needs: engine.MaxAge | engine.VirtualTime, run: func(c *conf) {
			b := c.broker() // the wall clock, virtual in the bubble
			topic := c.topic(b, "jobs", pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, MaxAge: time.Second, BlockTimeout: time.Hour}))
			stuck := newGate(c, false)
			subscribe(c, topic, "stuck", "s1", stuck.handler()) // commits nothing: only age makes room
			publishValue(c, topic, "j1")
			start := time.Now()
			pos := publishValue(c, topic, "j2")
			if waited := time.Since(start); waited < time.Second || waited > time.Second+time.Millisecond {
				c.Errorf("the blocked Publish returned after %v, want about the 1s MaxAge", waited)
			}
			if pos.Offset != 1 {
				c.Errorf("offset: got %d, want 1", pos.Offset)
			}
			st := topic.Stats()
			if st.Expired != 1 || st.Blocked != 1 || st.TimedOut != 0 || st.Retained != 1 {
				c.Errorf("stats: got %+v, want Expired 1, Blocked 1, TimedOut 0, Retained 1", st)
			}
			c.accounted(st)
			stuck.open()
			c.drain(b)
		}},
		{name: "MaxBytes bounds the key and value bytes a partition retains, under Block and with no group", needs: engine.MaxBytes, run: func(c *conf) {
			// Every record is 4 bytes ("k" and 3 bytes of value): 10 holds two.
			b := c.broker()
			blocking := c.topic(b, "blocking", pubsub.WithRetention(pubsub.Retention{MaxBytes: 10, BlockTimeout: shortWait}))
			stuck := newGate(c, false)
			subscribe(c, blocking, "stuck", "s1", stuck.handler())
			unread := c.topic(b, "unread", pubsub.WithRetention(pubsub.Retention{MaxBytes: 10, BlockTimeout: failureBound}))
			for _, topic := range []*pubsub.Topic[string, string]{blocking, unread} {
				publish(c, topic, "k", "one")
				publish(c, topic, "k", "two")
			}
			_, err := blocking.Publish(c.ctx(), "k", "six")
			c.wantIs("a third record under Block, with a group holding the first", err, pubsub.ErrBackpressure)
			if !contains(err, `"stuck"`) {
				c.Errorf("error %v: want it to name group \"stuck\"", err)
			}
			if got, want := blocking.Stats(), (pubsub.TopicStats{Published: 2, Retained: 2, RetainedBytes: 8, Blocked: 1, TimedOut: 1}); got != want {
				c.Errorf("Block stats: got %+v, want %+v", got, want)
			}
			publish(c, unread, "k", "six")
			if got, want := unread.Stats(), (pubsub.TopicStats{Published: 3, Retained: 2, RetainedBytes: 8, Dropped: 1}); got != want {
				c.Errorf("stats with no group: got %+v, want %+v", got, want)
			}
			stuck.open()
			c.drain(b)
		}},
		{name: "MaxBytes under DropOldest drops as many of the oldest records as a new one needs", needs: engine.MaxBytes | engine.DropsOldest, run: func(c *conf) {
			b, topic := c.brokerTopic("t", pubsub.WithRetention(pubsub.Retention{MaxBytes: 10, OnFull: pubsub.DropOldest}))
			stuck := newGate(c, false)
			subscribe(c, topic, "stuck", "s1", stuck.handler())
			publish(c, topic, "k", "one")
			publish(c, topic, "k", "two")
			publish(c, topic, "k", "three-six") // 10 bytes: both others must go
			if got, want := topic.Stats(), (pubsub.TopicStats{Published: 3, Retained: 1, RetainedBytes: 10, Dropped: 2}); got != want {
				c.Errorf("stats: got %+v, want %+v", got, want)
			}
			stuck.open()
			c.drain(b)
		}},
		{name: "a record larger than MaxBytes is ErrInvalid at once and appends nothing", needs: engine.MaxBytes, run: func(c *conf) {
			_, topic := c.brokerTopic("t", pubsub.WithRetention(pubsub.Retention{MaxBytes: 8, BlockTimeout: failureBound}))
			publish(c, topic, "k", "ok")
			before := topic.Stats()
			_, err := topic.Publish(c.ctx(), "key", "too long")
			c.wantIs("Publish of 11 bytes into MaxBytes 8", err, pubsub.ErrInvalid)
			pos, err := topic.PublishBatch(c.ctx(), []pubsub.Entry[string, string]{{Key: "k", Value: "a"}, {Key: "key", Value: "too long"}})
			c.wantIs("PublishBatch holding an oversize entry", err, pubsub.ErrInvalid)
			if len(pos) != 0 {
				c.Errorf("PublishBatch: got %d positions, want none", len(pos))
			}
			if got := topic.Stats(); got != before {
				c.Errorf("stats: got %+v, want them unchanged, %+v", got, before)
			}
		}},
		{name: "an impossible retention is ErrInvalid from NewTopic", run: func(c *conf) {
			b := c.broker()
			for name, r := range map[string]pubsub.Retention{
				"negative MaxMessages":  {MaxMessages: -1},
				"negative BlockTimeout": {BlockTimeout: -time.Second},
				"negative MaxAge":       {MaxAge: -time.Second},
				"negative MaxBytes":     {MaxBytes: -1},
				"unknown FullPolicy":    {OnFull: pubsub.FullPolicy(7)},
				"MaxMessages too large": {MaxMessages: pubsub.MaxTopicMessages + 1},
			} {
				_, err := pubsub.NewTopic(b, "t", codec.String(), codec.String(), pubsub.WithRetention(r))
				c.wantIs("NewTopic with "+name, err, pubsub.ErrInvalid)
			}
			if _, err := pubsub.NewTopic(b, "t", codec.String(), codec.String()); err != nil {
				c.Errorf("NewTopic(\"t\") after the failed ones: got %v, want nil (the name is still free)", err)
			}
		}},
	}
}
