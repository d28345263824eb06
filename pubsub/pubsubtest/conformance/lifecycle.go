package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

func drainCases() []confCase {
	return []confCase{
		{name: "Drain returns nil once every group has committed everything published before it", run: func(c *conf) {
			b, topic := c.brokerTopic("orders", pubsub.WithPartitions(3))
			var groups []*pubsub.Group[string]
			for _, name := range []string{"billing", "audit"} {
				groups = append(groups, subscribe(c, topic, name, name+"-1", pubsubtest.NewRecorder[string]()))
			}
			ends := map[int]int64{}
			for i := range 30 {
				pos := publish(c, topic, fmt.Sprint("key-", i), fmt.Sprint(i))
				ends[pos.Partition] = pos.Offset + 1
			}
			if err := b.Drain(c.ctx()); err != nil {
				c.Fatalf("Drain: %v", err)
			}
			for _, g := range groups {
				if lag := g.Lag(); lag != 0 {
					c.Errorf("group %s: Lag %d after Drain, want 0", g.Name(), lag)
				}
				for p, end := range ends {
					if got := g.Committed(p); got != end {
						c.Errorf("group %s: Committed(%d) %d after Drain, want %d", g.Name(), p, got, end)
					}
				}
				if lag, err := b.Lag(g.Name(), "orders"); lag != 0 || err != nil {
					c.Errorf("Broker.Lag(%s): got %d, %v; want 0, nil", g.Name(), lag, err)
				}
			}
		}},
		{name: "Drain returns ErrStalled at once naming a paused group with lag, and ignores one without lag", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			rec := pubsubtest.NewRecorder[string]()
			g := subscribe(c, topic, "billing", "b1", rec)
			subscribe(c, topic, "audit", "a1", pubsubtest.NewRecorder[string]())
			publishValue(c, topic, "a")
			c.drain(b)
			if err := g.Pause(c.ctx()); err != nil {
				c.Fatalf("Pause: %v", err)
			}
			if err := b.Drain(c.ctx()); err != nil {
				c.Errorf("Drain with a paused group that has no lag: got %v, want nil", err)
			}
			publishValue(c, topic, "b")
			err := b.Drain(c.ctx()) // returns before the failure bound, or fails with its error
			c.wantIs("Drain with a paused group that has lag", err, pubsub.ErrStalled)
			if !contains(err, `"billing"`) || contains(err, `"audit"`) {
				c.Errorf("Drain: %v, want it to name group \"billing\" and not \"audit\"", err)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				c.Errorf("Drain: %v, want it to return at once, not when its context ends", err)
			}
			if err := g.Resume(c.ctx()); err != nil {
				c.Fatalf("Resume: %v", err)
			}
			c.drain(b)
			if got, want := rec.Values(), []string{"a", "b"}; !slices.Equal(got, want) {
				c.Errorf("delivered %q, want %q", got, want)
			}
		}},
		{name: "Drain returns ErrStalled at once naming a group whose consumers all left", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			g := subscribe(c, topic, "billing", "b1", pubsubtest.NewRecorder[string]())
			if err := g.Leave(c.ctx(), "b1"); err != nil {
				c.Fatalf("Leave: %v", err)
			}
			publishValue(c, topic, "a")
			err := b.Drain(c.ctx())
			c.wantIs("Drain with a group without consumers", err, pubsub.ErrStalled)
			if !contains(err, `"billing"`) || errors.Is(err, context.DeadlineExceeded) {
				c.Errorf("Drain: %v, want it to name group \"billing\" at once", err)
			}
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "billing", "b2", rec)
			c.drain(b)
			if got, want := rec.Values(), []string{"a"}; !slices.Equal(got, want) {
				c.Errorf("the new consumer got %q, want %q", got, want)
			}
		}},
		{name: "Drain ends with its context, wrapping the context's error and naming the group left behind", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			gt := newGate(c, false)
			subscribe(c, topic, "billing", "b1", gt.handler())
			publishValue(c, topic, "a")
			err := b.Drain(c.within(shortWait))
			c.wantIs("Drain with a delivery in flight past its context", err, context.DeadlineExceeded)
			if !contains(err, `"billing"`) {
				c.Errorf("Drain: %v, want it to name group \"billing\"", err)
			}
			gt.open()
			c.drain(b)
		}},
	}
}

func closeCases() []confCase {
	return []confCase{
		{name: "Close drains every group, stops, and moves the state from Running to Stopped", run: func(c *conf) {
			b := c.broker()
			if s := b.State(); s != pubsub.Running {
				c.Errorf("a new broker's state: got %v, want %v", s, pubsub.Running)
			}
			topic := newTopic(c, b, "orders", codec.String(), codec.Int[int](), pubsub.WithPartitions(3))
			recs := []*pubsubtest.Recorder[int]{pubsubtest.NewRecorder[int](), pubsubtest.NewRecorder[int]()}
			groups := []*pubsub.Group[int]{subscribe(c, topic, "billing", "b1", recs[0]), subscribe(c, topic, "audit", "a1", recs[1])}
			var want []int
			for i := range 30 {
				publish(c, topic, fmt.Sprint("key-", i), i)
				want = append(want, i)
			}
			if err := b.Close(c.ctx()); err != nil {
				c.Fatalf("Close: got %v, want nil", err)
			}
			if s := b.State(); s != pubsub.Stopped {
				c.Errorf("state after Close: got %v, want %v", s, pubsub.Stopped)
			}
			for i, rec := range recs {
				got := rec.Values()
				slices.Sort(got)
				if !slices.Equal(got, want) || groups[i].Lag() != 0 {
					c.Errorf("group %s: got %v and Lag %d, want each of 0..29 once and no lag", groups[i].Name(), got, groups[i].Lag())
				}
			}
		}},
		{name: "after Close every call that adds work fails with ErrClosed, and the reads keep working", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			rec := pubsubtest.NewRecorder[string]()
			g := subscribe(c, topic, "billing", "b1", rec)
			publishValue(c, topic, "before")
			if err := b.Close(c.ctx()); err != nil {
				c.Fatalf("Close: %v", err)
			}
			nop := pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil })
			calls := map[string]error{
				"Publish":                  second(topic.Publish(c.ctx(), "k", "v")),
				"PublishValue":             second(topic.PublishValue(c.ctx(), "v")),
				"PublishBatch":             second(topic.PublishBatch(c.ctx(), []pubsub.Entry[string, string]{{Key: "k", Value: "v"}})),
				"Subscribe to the group":   second(topic.Subscribe("billing", "b2", nop)),
				"Subscribe to a new group": second(topic.Subscribe("audit", "a1", nop)),
				"Stream":                   second(topic.Stream("audit", "a1")),
				"NewTopic":                 second(pubsub.NewTopic(b, "more", codec.String(), codec.String())),
				"Seek":                     g.Seek(c.ctx(), 0, 0),
				"Group.Replay":             g.Replay(c.ctx(), pubsub.Earliest()),
				"Broker.Replay":            b.Replay(c.ctx(), "billing", "orders", pubsub.Earliest()),
				"Leave":                    g.Leave(c.ctx(), "b1"),
			}
			for name, err := range calls {
				c.wantIs(name+" after Close", err, pubsub.ErrClosed)
			}
			if err := g.Pause(c.ctx()); err != nil {
				c.Errorf("Pause after Close: got %v, want nil (it does nothing)", err)
			}
			if err := g.Resume(c.ctx()); err != nil {
				c.Errorf("Resume after Close: got %v, want nil (it does nothing)", err)
			}
			if st := topic.Stats(); st.Published != 1 {
				c.Errorf("Published: got %d, want 1", st.Published)
			}
			if g.Committed(0) != 1 || g.Lag() != 0 || g.Stats().Delivered != 1 || len(g.DeadLetters()) != 0 {
				c.Errorf("reads after Close: Committed(0) %d, Lag %d, stats %+v; want 1, 0, one delivered", g.Committed(0), g.Lag(), g.Stats())
			}
			if got := rec.Values(); !slices.Equal(got, []string{"before"}) {
				c.Errorf("delivered %q, want [before]", got)
			}
		}},
		{name: "Close fails a producer blocked on a full partition with ErrClosed", run: func(c *conf) {
			b, topic := c.brokerTopic("jobs", pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, BlockTimeout: failureBound}))
			gt := newGate(c, false)
			subscribe(c, topic, "stuck", "s1", gt.handler())
			publishValue(c, topic, "j1")
			c.wait("the delivery of j1", gt.entered)
			blocked := make(chan error, 1)
			go func() { blocked <- second(topic.PublishValue(c.ctx(), "j2")) }()
			c.settle()
			closed := make(chan error, 1)
			go func() { closed <- b.Close(c.ctx()) }()
			err := <-blocked // while Close waits for the gate
			c.wantIs("the blocked Publish", err, pubsub.ErrClosed)
			gt.open()
			if err := <-closed; err != nil {
				c.Errorf("Close: got %v, want nil", err)
			}
			if got := topic.Stats().Published; got != 1 {
				c.Errorf("Published: got %d, want 1", got)
			}
		}},
		{name: "a Close whose context ends returns a ShutdownError naming each partition left, and cancels the handlers' context", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			gt := newGate(c, true)
			g := subscribe(c, topic, "billing", "b1", gt.handler())
			publishValue(c, topic, "stuck")
			publishValue(c, topic, "never")
			c.wait("the delivery of stuck", gt.entered)
			err := b.Close(c.within(50 * time.Millisecond))
			se, ok := errors.AsType[*pubsub.ShutdownError](err)
			if !ok {
				c.Fatalf("Close: got %T (%v), want a *pubsub.ShutdownError", err, err)
			}
			c.wantIs("Close", err, context.DeadlineExceeded)
			var got []pubsub.Unfinished
			for _, u := range se.Unfinished {
				u.Running = false // timing: whether the handler returned within the grace is not the point here
				got = append(got, u)
			}
			if want := []pubsub.Unfinished{{Group: "billing", Topic: "orders", Partition: 0, Committed: 0, End: 2}}; !slices.Equal(got, want) {
				c.Errorf("Unfinished: got %+v, want %+v", se.Unfinished, want)
			}
			select {
			case err := <-gt.ctxErr:
				c.wantIs("the handler's ctx.Err()", err, context.Canceled)
			case <-c.ctx().Done():
				c.Error("the handler's context was not cancelled")
			}
			if s := b.State(); s != pubsub.Stopped {
				c.Errorf("state after Close: got %v, want %v", s, pubsub.Stopped)
			}
			if got, want := g.Stats(), (pubsub.GroupStats{}); got != want {
				c.Errorf("stats: got %+v, want %+v (an interrupted delivery is no failure)", got, want)
			}
		}},
		{name: "a handler still running when Close gives up is reported Running, and commits nothing when it returns", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			gt := newGate(c, false)
			g := subscribe(c, topic, "billing", "b1", gt.handler())
			publishValue(c, topic, "o1")
			c.wait("the delivery of o1", gt.entered)
			err := b.Close(c.within(shortWait))
			wantUnfinished(c, err, []pubsub.Unfinished{{Group: "billing", Topic: "orders", Partition: 0, Committed: 0, End: 1, Running: true}}...)
			if s := b.State(); s != pubsub.Stopped {
				c.Errorf("state after Close: got %v, want %v", s, pubsub.Stopped)
			}
			gt.open()
			c.wait("the handler's return", gt.returned)
			lateCommittedNothing(c, g, "handler")
		}},
		{name: "Close returns by its deadline plus 10ms even if a handler ignores its context, and the broker is Draining meanwhile", needs: engine.VirtualTime, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			gt := newGate(c, false)
			subscribe(c, topic, "ignores", "i1", gt.handler())
			// A handler that honours its context: cancelled when Close's
			// context ends, it returns within the grace, so it is no longer
			// running when Close returns.
			var cancelledAfter time.Duration
			start := time.Now()
			subscribe(c, topic, "honours", "h1", pubsub.HandlerFunc[string](func(ctx context.Context, _ pubsub.Message[string]) error {
				<-ctx.Done()
				cancelledAfter = time.Since(start)
				return ctx.Err()
			}))
			publishValue(c, topic, "o1")
			c.settle()
			closed := make(chan error, 1)
			go func() { closed <- b.Close(c.within(100 * time.Millisecond)) }()
			c.settle()
			if s := b.State(); s != pubsub.Draining {
				c.Errorf("state during Close: got %v, want %v", s, pubsub.Draining)
			}
			_, err := topic.PublishValue(c.ctx(), "late")
			c.wantIs("PublishValue while Close drains", err, pubsub.ErrClosed)
			err = <-closed
			if took := time.Since(start); took < 100*time.Millisecond || took > 110*time.Millisecond {
				c.Errorf("Close took %v, want between 100ms and 100ms + 10ms", took)
			}
			if cancelledAfter != 100*time.Millisecond {
				c.Errorf("the handlers' context ended %v after Close began, want when Close's did, after 100ms", cancelledAfter)
			}
			wantUnfinished(c, err,
				pubsub.Unfinished{Group: "honours", Topic: "orders", Partition: 0, Committed: 0, End: 1},
				pubsub.Unfinished{Group: "ignores", Topic: "orders", Partition: 0, Committed: 0, End: 1, Running: true})
			gt.open()
		}},
		{name: "Close with a paused group returns at once a ShutdownError wrapping ErrStalled", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			rec, _ := pausedWithLag(c, b, topic)
			err := b.Close(c.ctx())
			wantUnfinished(c, err, pubsub.Unfinished{Group: "billing", Topic: "orders", Partition: 0, Committed: 1, End: 3})
			if !errors.Is(err, pubsub.ErrStalled) || errors.Is(err, context.DeadlineExceeded) {
				c.Errorf("Close: got %v, want it to wrap ErrStalled, at once", err)
			}
			if got := rec.Values(); !slices.Equal(got, []string{"a"}) {
				c.Errorf("delivered %q, want [a]", got)
			}
		}},
		{name: "a later Close whose context ends first returns its context's error, and the first goes on draining", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			gt := newGate(c, false)
			subscribe(c, topic, "billing", "b1", gt.handler())
			publishValue(c, topic, "o1")
			c.wait("the delivery of o1", gt.entered)
			first := make(chan error, 1)
			go func() { first <- b.Close(c.ctx()) }()
			c.waitClosing(b)
			later := make(chan error, 1)
			go func() { later <- b.Close(c.within(shortWait)) }()
			select {
			case err := <-later:
				c.wantIs("the later Close, whose context ended first", err, context.DeadlineExceeded)
				if _, ok := errors.AsType[*pubsub.ShutdownError](err); ok {
					c.Errorf("the later Close: got %v, want its context's error: the first has not said what was left yet", err)
				}
			case <-c.ctx().Done():
				c.Fatalf("the later Close did not return within %v: it waited for the first, not for its own context", failureBound)
			}
			select {
			case err := <-first:
				c.Fatalf("the first Close returned %v while the delivery it drains was in flight", err)
			default:
			}
			gt.open()
			select {
			case err := <-first:
				if err != nil {
					c.Errorf("the first Close: got %v, want nil: it drained everything", err)
				}
			case <-c.ctx().Done():
				c.Fatalf("the first Close did not return within %v of the delivery's end", failureBound)
			}
			if err := b.Close(c.within(shortWait)); err != nil {
				c.Errorf("a Close after the first: got %v, want the first's result, nil", err)
			}
		}},
		{name: "Close is idempotent and safe to call concurrently: every call returns the first one's result", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			g := subscribe(c, topic, "billing", "b1", pubsubtest.NewRecorder[string]())
			if err := g.Pause(c.ctx()); err != nil {
				c.Fatalf("Pause: %v", err)
			}
			publishValue(c, topic, "left behind") // so that Close has something to report
			errs := make([]error, 4)
			var wg sync.WaitGroup
			for i := range errs {
				wg.Go(func() { errs[i] = b.Close(c.ctx()) })
			}
			wg.Wait()
			errs = append(errs, b.Close(c.ctx()))
			for i, err := range errs {
				if _, ok := errors.AsType[*pubsub.ShutdownError](err); !ok || fmt.Sprint(err) != fmt.Sprint(errs[0]) {
					c.Errorf("Close #%d: got %v, want the ShutdownError every call returns: %v", i+1, err, errs[0])
				}
			}
		}},
	}
}

func second[T any](_ T, err error) error { return err }
