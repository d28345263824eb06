package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// deleteCases checks the lifecycle beyond Close: deleting groups and
// topics, dropping and paging dead letters, and Ping.
func deleteCases() []confCase {
	deletes := engine.Delete
	return []confCase{
		{name: "DeleteGroup wakes a Publish blocked on a Block partition the group held full, which then appends", needs: deletes, run: func(c *conf) {
			b, topic := c.brokerTopic("jobs", pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, BlockTimeout: 2 * failureBound}))
			// The newcomer's case: a group nobody consumes any more holds
			// every record, and a Block partition fills up behind it.
			g := subscribe(c, topic, "abandoned", "a1", pubsubtest.NewRecorder[string]())
			if err := g.Leave(c.ctx(), "a1"); err != nil {
				c.Fatalf("Leave: %v", err)
			}
			publishValue(c, topic, "j0")
			publishValue(c, topic, "j1")
			published := publishLater(c, topic, "j2")
			c.settle()
			select {
			case r := <-published:
				c.Fatalf("Publish to a partition the group holds full returned offset %d, %v; want it to wait", r.pos.Offset, r.err)
			default:
			}
			if err := b.DeleteGroup(c.ctx(), "abandoned", "jobs"); err != nil {
				c.Fatalf("DeleteGroup: %v", err)
			}
			// The BlockTimeout is twice the subtest's bound: a Publish that
			// was not woken fails with the subtest's context instead.
			if r := <-published; r.err != nil || r.pos.Offset != 2 {
				c.Fatalf("the blocked Publish after DeleteGroup: got offset %d, %v; want offset 2 and no error", r.pos.Offset, r.err)
			}
			if st := topic.Stats(); st.Published != 3 || st.TimedOut != 0 {
				c.Errorf("stats %+v: want 3 published, none timed out", st)
			}
		}},
		{name: "after DeleteGroup its handle fails with ErrSubscription, its Stream's channel closes, and the name starts afresh", needs: deletes, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			s := stream(c, topic, "billing", "b1", pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 1}))
			old := s.Group()
			audit := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "audit", "a1", audit)
			publishValues(c, topic, "a", "b", "c")
			recv(c, s).Ack()
			recv(c, s).Nack(errBoom) // dead-lettered: one attempt only
			held := recv(c, s)       // "c", held by the caller
			if err := b.DeleteGroup(c.within(shortWait), "billing", "orders"); !errors.Is(err, context.DeadlineExceeded) {
				c.Errorf("DeleteGroup with a delivery held past its ctx: got %v, want an error wrapping context.DeadlineExceeded", err)
			}
			// Deleted all the same: the held delivery settles into nothing,
			// and the stream's channel closes.
			held.Ack()
			waitClosed(c, s)
			if err := s.Close(); err != nil {
				c.Errorf("Stream.Close after DeleteGroup: got %v, want nil (nothing to leave)", err)
			}
			calls := map[string]error{
				"Pause":  old.Pause(c.ctx()),
				"Resume": old.Resume(c.ctx()),
				"Seek":   old.Seek(c.ctx(), 0, 0),
				"Replay": old.Replay(c.ctx(), pubsub.Earliest()),
				"Leave":  old.Leave(c.ctx(), "b1"),
			}
			if _, err := old.LatestDeadLetters(c.ctx(), 10); err != nil {
				// An engine that cannot page its dead letters lets the
				// typed layer read them all; then no error, but no letter.
				calls["LatestDeadLetters"] = err
			}
			for name, err := range calls {
				c.wantIs("the deleted group's "+name, err, pubsub.ErrSubscription)
			}
			if _, err := b.Lag("billing", "orders"); !errors.Is(err, pubsub.ErrSubscription) {
				c.Errorf("Broker.Lag of the deleted group: got %v, want ErrSubscription", err)
			}
			if err := b.DeleteGroup(c.ctx(), "billing", "orders"); !errors.Is(err, pubsub.ErrSubscription) {
				c.Errorf("DeleteGroup again: got %v, want ErrSubscription", err)
			}
			if lag, letters := old.Lag(), old.DeadLetters(); lag != 0 || len(letters) != 0 {
				c.Errorf("the deleted group's reads: Lag %d and %d dead letters, want an empty group", lag, len(letters))
			}
			for _, ts := range b.Snapshot().Topics {
				for _, gs := range ts.Groups {
					if gs.Name == "billing" {
						c.Errorf("Snapshot still lists the deleted group: %+v", gs)
					}
				}
			}

			// The name starts afresh: from the earliest record, with no
			// offsets and no dead letters of the old group's.
			rec := pubsubtest.NewRecorder[string]()
			fresh := subscribe(c, topic, "billing", "b2", rec)
			if fresh == old {
				c.Error("Subscribe after DeleteGroup returned the deleted group's handle")
			}
			publishValue(c, topic, "d")
			c.drain(b)
			if got := rec.Values(); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
				c.Errorf("the new group got %q, want every retained record from the earliest", got)
			}
			if n := len(fresh.DeadLetters()); n != 0 || fresh.Stats() != (pubsub.GroupStats{Delivered: 4}) {
				c.Errorf("the new group: %d dead letters and stats %+v, want none and 4 delivered", n, fresh.Stats())
			}
			if err := old.Pause(c.ctx()); !errors.Is(err, pubsub.ErrSubscription) {
				c.Errorf("the deleted group's handle once the name was taken again: got %v, want ErrSubscription", err)
			}
			if got := audit.Values(); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
				c.Errorf("the other group got %q, want every record: DeleteGroup deletes one group", got)
			}
		}},
		{name: "DeleteGroup waits for a handler in flight only until its ctx ends, and the group is deleted all the same", needs: deletes, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			stuck := newGate(c, false)
			old := subscribe(c, topic, "billing", "b1", stuck.handler())
			publishValue(c, topic, "a")
			c.wait("the delivery", stuck.entered)
			if err := b.DeleteGroup(c.within(shortWait), "billing", "orders"); !errors.Is(err, context.DeadlineExceeded) {
				c.Errorf("DeleteGroup with a handler in flight past its ctx: got %v, want an error wrapping context.DeadlineExceeded", err)
			}
			if err := old.Pause(c.ctx()); !errors.Is(err, pubsub.ErrSubscription) {
				c.Errorf("the deleted group's Pause: got %v, want ErrSubscription", err)
			}
			stuck.open()
			c.wait("the handler's return", stuck.returned)
			// The late ack moved nothing: a group made under the name now
			// starts from the earliest record.
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "billing", "b2", rec)
			c.drain(b)
			if got := rec.Values(); !slices.Equal(got, []string{"a"}) {
				c.Errorf("the new group got %q, want [a]", got)
			}
		}},
		{name: "DeleteTopic deletes its groups, its handles fail with ErrTopicNotFound also once the name is created again, which starts afresh", needs: deletes, run: func(c *conf) {
			b := c.broker()
			old := c.topic(b, "orders", pubsub.WithPartitions(2))
			g := subscribe(c, old, "billing", "b1", pubsubtest.NewRecorder[string]())
			s := stream(c, old, "audit", "a1")
			publish(c, old, "k", "a")
			if d := recv(c, s); d.Value != "a" {
				c.Fatalf("stream got %q, want a", d.Value)
			} else {
				d.Ack()
			}
			if err := b.DeleteTopic(c.ctx(), "orders"); err != nil {
				c.Fatalf("DeleteTopic: %v", err)
			}
			waitClosed(c, s)
			oldHandles := func(when string) {
				c.Helper()
				_, pubErr := old.Publish(c.ctx(), "k", "b")
				_, subErr := old.Subscribe("billing", "b9", pubsubtest.NewRecorder[string]())
				_, streamErr := old.Stream("fresh", "f1")
				for name, err := range map[string]error{
					"Topic.Publish":   pubErr,
					"Topic.Subscribe": subErr,
					"Topic.Stream":    streamErr,
					"Group.Pause":     g.Pause(c.ctx()),
					"Group.Seek":      g.Seek(c.ctx(), 0, 0),
					"Group.Leave":     g.Leave(c.ctx(), "b1"),
				} {
					c.wantIs(when+": the deleted topic's "+name, err, pubsub.ErrTopicNotFound)
				}
			}
			oldHandles("after DeleteTopic")
			for name, err := range map[string]error{
				"DeleteTopic again":          b.DeleteTopic(c.ctx(), "orders"),
				"DeleteGroup of its group":   b.DeleteGroup(c.ctx(), "billing", "orders"),
				"Broker.Replay of its group": b.Replay(c.ctx(), "billing", "orders", pubsub.Earliest()),
			} {
				c.wantIs(name, err, pubsub.ErrTopicNotFound)
			}
			if _, err := b.Group("billing", "orders"); !errors.Is(err, pubsub.ErrTopicNotFound) {
				c.Errorf("Broker.Group of its group: got %v, want ErrTopicNotFound", err)
			}
			if topics := b.Snapshot().Topics; len(topics) != 0 {
				c.Errorf("Snapshot after DeleteTopic lists %d topics, want none", len(topics))
			}

			// The name again, with another shape: nothing of the old topic.
			again := c.topic(b, "orders", pubsub.WithPartitions(3))
			if n, st := again.Partitions(), again.Stats(); n != 3 || st.Published != 0 {
				c.Errorf("the topic created again: %d partitions, %d published; want 3 and 0", n, st.Published)
			}
			oldHandles("once the name was created again")
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, again, "billing", "b1", rec)
			publishValue(c, again, "x")
			c.drain(b)
			if got := rec.Values(); !slices.Equal(got, []string{"x"}) {
				c.Errorf("the new topic's group got %q, want [x]", got)
			}
			if st := again.Stats(); st.Published != 1 {
				c.Errorf("the new topic: %d published, want 1 (the old handle's Publish must not reach it)", st.Published)
			}
		}},
		{name: "DeleteTopic fails a Publish blocked on its full partition with ErrTopicNotFound", needs: deletes, run: func(c *conf) {
			b, topic := c.brokerTopic("jobs", pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, BlockTimeout: 2 * failureBound}))
			stuck := newGate(c, false)
			subscribe(c, topic, "stuck", "s1", stuck.handler())
			publishValue(c, topic, "j0")
			published := make(chan error, 1)
			go func() {
				_, err := topic.PublishValue(c.ctx(), "j1")
				published <- err
			}()
			c.settle()
			// The handler holds its delivery past DeleteTopic's ctx: the
			// topic is deleted all the same.
			if err := b.DeleteTopic(c.within(shortWait), "jobs"); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				c.Errorf("DeleteTopic: got %v, want nil or an error wrapping context.DeadlineExceeded", err)
			}
			c.wantIs("the Publish blocked on the deleted topic", <-published, pubsub.ErrTopicNotFound)
			stuck.open()
		}},
		{name: "DeleteGroup and DeleteTopic of names that do not exist are ErrSubscription and ErrTopicNotFound", needs: deletes, run: func(c *conf) {
			b := c.broker()
			c.topic(b, "orders")
			c.wantIs("DeleteGroup of an unknown group", b.DeleteGroup(c.ctx(), "nobody", "orders"), pubsub.ErrSubscription)
			c.wantIs("DeleteGroup on an unknown topic", b.DeleteGroup(c.ctx(), "nobody", "nowhere"), pubsub.ErrTopicNotFound)
			c.wantIs("DeleteTopic of an unknown topic", b.DeleteTopic(c.ctx(), "nowhere"), pubsub.ErrTopicNotFound)
		}},
		{name: "DiscardDeadLetters removes the letters match accepts and counts them, leaves the others in order, and nil match removes all", needs: engine.DiscardDeadLetters, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			g := subscribe(c, topic, "billing", "b1", &callLog[string]{fail: func(pubsub.Message[string]) error { return pubsub.ErrPermanent }})
			for i := range 5 {
				publishValue(c, topic, fmt.Sprint(i))
			}
			c.drain(b)
			even := func(l pubsub.DeadLetter[string]) bool {
				return l.Message.Value == "0" || l.Message.Value == "2" || l.Message.Value == "4"
			}
			if n, err := g.DiscardDeadLetters(c.ctx(), even); n != 3 || err != nil {
				c.Errorf("DiscardDeadLetters(even): got %d, %v; want 3, nil", n, err)
			}
			if got := letterValues(g.DeadLetters()); !slices.Equal(got, []string{"1", "3"}) {
				c.Errorf("dead letters left: %q, want [1 3], oldest first", got)
			}
			if n, err := g.DiscardDeadLetters(c.ctx(), func(pubsub.DeadLetter[string]) bool { return false }); n != 0 || err != nil {
				c.Errorf("DiscardDeadLetters matching none: got %d, %v; want 0, nil", n, err)
			}
			if n, err := g.DiscardDeadLetters(c.ctx(), nil); n != 2 || err != nil {
				c.Errorf("DiscardDeadLetters(nil): got %d, %v; want 2, nil", n, err)
			}
			if n := len(g.DeadLetters()); n != 0 {
				c.Errorf("%d dead letters left after DiscardDeadLetters(nil), want none", n)
			}
			if st := g.Stats(); st.DeadLettered != 5 || g.Lag() != 0 {
				c.Errorf("stats %+v, lag %d: want 5 dead-lettered still counted and no lag", st, g.Lag())
			}
		}},
		{name: "LatestDeadLetters returns the newest n letters, newest first; 0 none, and a negative n is ErrInvalid", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			g := subscribe(c, topic, "billing", "b1", &callLog[string]{fail: func(pubsub.Message[string]) error { return pubsub.ErrPermanent }})
			for i := range 5 {
				publishValue(c, topic, fmt.Sprint(i))
			}
			c.drain(b)
			for _, tc := range []struct {
				n    int
				want []string
			}{
				{2, []string{"4", "3"}},
				{5, []string{"4", "3", "2", "1", "0"}},
				{9, []string{"4", "3", "2", "1", "0"}},
				{0, []string{}},
			} {
				letters, err := g.LatestDeadLetters(c.ctx(), tc.n)
				if got := letterValues(letters); err != nil || !slices.Equal(got, tc.want) {
					c.Errorf("LatestDeadLetters(%d): got %q, %v; want %q, nil", tc.n, got, err, tc.want)
				}
			}
			if letters, err := g.LatestDeadLetters(c.ctx(), 1); err == nil && len(letters) == 1 && letters[0].Attempts != 1 {
				c.Errorf("the newest letter: %d attempts, want 1 (ErrPermanent)", letters[0].Attempts)
			}
			_, err := g.LatestDeadLetters(c.ctx(), -1)
			c.wantIs("LatestDeadLetters(-1)", err, pubsub.ErrInvalid)
			if n := len(g.DeadLetters()); n != 5 {
				c.Errorf("%d dead letters after reading the newest, want all 5 still there", n)
			}
		}},
		{name: "Ping is nil while the broker runs; after Close, Ping and every lifecycle call that changes something fail with ErrClosed, and LatestDeadLetters reads or says ErrClosed", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			g := subscribe(c, topic, "billing", "b1", pubsubtest.NewRecorder[string]())
			if err := b.Ping(c.ctx()); err != nil {
				c.Errorf("Ping on a running broker: got %v, want nil", err)
			}
			if err := b.Close(c.ctx()); err != nil {
				c.Fatalf("Close: %v", err)
			}
			_, discardErr := g.DiscardDeadLetters(c.ctx(), nil)
			_, latestErr := g.LatestDeadLetters(c.ctx(), 1)
			for name, err := range map[string]error{
				"Ping":               b.Ping(c.ctx()),
				"DeleteGroup":        b.DeleteGroup(c.ctx(), "billing", "orders"),
				"DeleteTopic":        b.DeleteTopic(c.ctx(), "orders"),
				"DiscardDeadLetters": discardErr,
			} {
				c.wantIs(name+" after Close", err, pubsub.ErrClosed)
			}
			if latestErr != nil {
				c.wantIs("LatestDeadLetters after Close", latestErr, pubsub.ErrClosed)
			}
		}},
	}
}

// letterValues returns the values of letters.
func letterValues(letters []pubsub.DeadLetter[string]) []string {
	out := make([]string, len(letters))
	for i, l := range letters {
		out[i] = l.Message.Value
	}
	return out
}
