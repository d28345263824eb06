package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

func errorCases() []confCase {
	return []confCase{
		{name: `every error wraps a pubsub sentinel or a context's error and says "logbus: " once, in front`, run: func(c *conf) {
			b := c.broker()
			orders := newTopic(c, b, "orders", pickyStrings(), pickyStrings())
			g := subscribe(c, orders, "billing", "b1", pubsubtest.NewRecorder[string](), pubsub.WithDeadLetterLimit(10))
			publish(c, orders, "k", "v")
			c.drain(b)
			jobsGate, fullGate := newGate(c, false), newGate(c, false)
			jobs := c.topic(b, "jobs", pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, BlockTimeout: failureBound}))
			full := c.topic(b, "full", pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, BlockTimeout: shortWait}))
			stuck := subscribe(c, jobs, "stuck", "s1", jobsGate.handler())
			subscribe(c, full, "stuck", "s1", fullGate.handler())
			publishValue(c, jobs, "j1")
			publishValue(c, full, "f1")
			c.wait("the delivery of j1", jobsGate.entered)
			stalled := c.broker()
			idle := c.topic(stalled, "idle")
			paused := subscribe(c, idle, "paused", "p1", pubsubtest.NewRecorder[string]())
			if err := paused.Pause(c.ctx()); err != nil {
				c.Fatalf("Pause: %v", err)
			}
			publishValue(c, idle, "waits")
			var zero pubsub.Broker
			var nilCtx context.Context
			nop := pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil })

			type call struct {
				name string
				err  error
				want error
			}
			calls := []call{
				{"NewTopic with a taken name", second(pubsub.NewTopic(b, "orders", codec.String(), codec.String())), pubsub.ErrTopicExists},
				{"NewTopic with a nil codec", second(pubsub.NewTopic[string, string](b, "x", nil, codec.String())), pubsub.ErrInvalid},
				{"NewTopic with an empty name", second(pubsub.NewTopic(b, "", codec.String(), codec.String())), pubsub.ErrInvalid},
				{"NewTopic with 0 partitions", second(pubsub.NewTopic(b, "x", codec.String(), codec.String(), pubsub.WithPartitions(0))), pubsub.ErrInvalid},
				{"NewTopic on a Broker NewBroker did not make", second(pubsub.NewTopic(&zero, "x", codec.String(), codec.String())), pubsub.ErrInvalid},
				{"NewTopic on a broker with a bad option", second(pubsub.NewTopic(c.broker(pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: -1})), "x", codec.String(), codec.String())), pubsub.ErrInvalid},
				{"Publish of a value the codec cannot encode", second(orders.Publish(c.ctx(), "k", "unencodable")), pubsub.ErrInvalid},
				{"Publish of a key the codec cannot encode", second(orders.Publish(c.ctx(), "unencodable", "v")), pubsub.ErrInvalid},
				{"Publish with a nil context", second(orders.Publish(nilCtx, "k", "v")), pubsub.ErrInvalid},
				{"Publish blocked past its context", second(jobs.PublishValue(c.within(shortWait), "j2")), context.DeadlineExceeded},
				{"Publish blocked past BlockTimeout", second(full.PublishValue(c.ctx(), "f2")), pubsub.ErrBackpressure},
				{"Subscribe with a nil handler", second(orders.Subscribe("billing", "b2", nil)), pubsub.ErrSubscription},
				{"Subscribe of a consumer already in the group", second(orders.Subscribe("billing", "b1", nop)), pubsub.ErrSubscription},
				{"Subscribe with other options than the group's", second(orders.Subscribe("billing", "b2", nop)), pubsub.ErrSubscription},
				{"Stream with an empty group name", second(orders.Stream("", "s1")), pubsub.ErrSubscription},
				{"Leave of an unknown consumer", g.Leave(c.ctx(), "nobody"), pubsub.ErrSubscription},
				{"Seek past the end", g.Seek(c.ctx(), 0, 9), pubsub.ErrOffsetOutOfRange},
				{"Seek of a partition that does not exist", g.Seek(c.ctx(), 3, 0), pubsub.ErrInvalid},
				{"Replay to a negative offset", g.Replay(c.ctx(), pubsub.AtOffset(-1)), pubsub.ErrInvalid},
				{"Pause with a nil context", g.Pause(nilCtx), pubsub.ErrInvalid},
				{"Broker.Replay of an unknown group", b.Replay(c.ctx(), "nobody", "orders", pubsub.Earliest()), pubsub.ErrSubscription},
				{"Broker.Replay of an unknown topic", b.Replay(c.ctx(), "billing", "nothing", pubsub.Earliest()), pubsub.ErrTopicNotFound},
				{"Lag of an unknown topic", second(b.Lag("billing", "nothing")), pubsub.ErrTopicNotFound},
				{"Lag of an unknown group", second(b.Lag("nobody", "orders")), pubsub.ErrSubscription},
				{"Topic.Key of a keyless message", second(orders.Key(pubsub.Message[string]{})), pubsub.ErrInvalid},
				{"Drain past its context", b.Drain(c.within(shortWait)), context.DeadlineExceeded},
				{"Drain with a paused group", stalled.Drain(c.ctx()), pubsub.ErrStalled},
				{"Pause past its context", stuck.Pause(c.within(shortWait)), context.DeadlineExceeded},
				{"Close with a paused group", stalled.Close(c.ctx()), pubsub.ErrStalled},
				{"Close past its context", b.Close(c.within(shortWait)), context.DeadlineExceeded},
			}
			calls = append(calls, call{"Publish after Close", second(orders.Publish(c.ctx(), "k", "v")), pubsub.ErrClosed})
			sentinels := []error{pubsub.ErrTopicExists, pubsub.ErrTopicNotFound, pubsub.ErrClosed, pubsub.ErrBackpressure,
				pubsub.ErrOffsetOutOfRange, pubsub.ErrSubscription, pubsub.ErrInvalid, pubsub.ErrStalled, pubsub.ErrPermanent,
				context.Canceled, context.DeadlineExceeded}
			for _, cl := range calls {
				if cl.err == nil {
					c.Errorf("%s: got nil, want an error wrapping %v", cl.name, cl.want)
					continue
				}
				if msg := cl.err.Error(); !strings.HasPrefix(msg, "logbus: ") || strings.Count(msg, "logbus:") != 1 {
					c.Errorf("%s: %q, want \"logbus: \" once, in front", cl.name, msg)
				}
				if !errors.Is(cl.err, cl.want) {
					c.Errorf("%s: %v, want it to wrap %v", cl.name, cl.err, cl.want)
				}
				if !slices.ContainsFunc(sentinels, func(s error) bool { return errors.Is(cl.err, s) }) {
					c.Errorf("%s: %v wraps no pubsub sentinel and no context error", cl.name, cl.err)
				}
			}
			jobsGate.open()
			fullGate.open()
		}},
		{name: "joining a group with options that differ from its own is ErrSubscription, and the group keeps its own", run: func(c *conf) {
			_, topic := c.brokerTopic("orders")
			nop := pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil })
			retry := pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 2})
			g := subscribe(c, topic, "billing", "b1", nop, pubsub.StartAt(pubsub.Latest()), retry)
			for name, opts := range map[string][]pubsub.SubscribeOption{
				"no options":        nil,
				"another Start":     {pubsub.StartAt(pubsub.Earliest()), retry},
				"another retry":     {pubsub.StartAt(pubsub.Latest()), pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 3})},
				"a dead-letter cap": {pubsub.StartAt(pubsub.Latest()), retry, pubsub.WithDeadLetterLimit(5)},
			} {
				got, err := topic.Subscribe("billing", "b2", nop, opts...)
				c.wantIs("Subscribe with "+name, err, pubsub.ErrSubscription)
				if got != nil {
					c.Errorf("Subscribe with %s: got a Group alongside the error, want nil", name)
				}
				_, err = topic.Stream("billing", "s2", opts...)
				c.wantIs("Stream with "+name, err, pubsub.ErrSubscription)
			}
			if asg := g.Assignment(); len(asg) != 1 || !slices.Equal(asg["b1"], []int{0}) {
				c.Errorf("assignment after the failed joins: got %v, want only b1, owning partition 0", asg)
			}
			if _, err := topic.Subscribe("billing", "b2", nop, pubsub.StartAt(pubsub.Latest()), retry); err != nil {
				c.Errorf("Subscribe with the group's own options: got %v, want nil", err)
			}
		}},
		{name: "a bad Subscribe or Stream is ErrSubscription or ErrInvalid and creates nothing", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			publishValue(c, topic, "x")
			nop := pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil })
			for _, tc := range []struct {
				name, group string
				join        func() (bool, error)
				want        error
			}{
				{"a nil Handler", "g", func() (bool, error) { g, err := topic.Subscribe("g", "c", nil); return g != nil, err }, pubsub.ErrSubscription},
				{"a nil HandlerFunc", "g", func() (bool, error) {
					g, err := topic.Subscribe("g", "c", pubsub.HandlerFunc[string](nil))
					return g != nil, err
				}, pubsub.ErrSubscription},
				{"an empty group name", "", func() (bool, error) { g, err := topic.Subscribe("", "c", nop); return g != nil, err }, pubsub.ErrSubscription},
				{"an empty consumer name", "g", func() (bool, error) { g, err := topic.Subscribe("g", "", nop); return g != nil, err }, pubsub.ErrSubscription},
				{"a negative MaxAttempts", "g", func() (bool, error) {
					g, err := topic.Subscribe("g", "c", nop, pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: -1}))
					return g != nil, err
				}, pubsub.ErrInvalid},
				{"a Multiplier below 1", "g", func() (bool, error) {
					g, err := topic.Subscribe("g", "c", nop, pubsub.WithGroupRetry(pubsub.RetryPolicy{Multiplier: 0.5}))
					return g != nil, err
				}, pubsub.ErrInvalid},
				{"a negative dead-letter limit", "g", func() (bool, error) {
					g, err := topic.Subscribe("g", "c", nop, pubsub.WithDeadLetterLimit(-1))
					return g != nil, err
				}, pubsub.ErrInvalid},
				{"a negative start offset", "g", func() (bool, error) {
					g, err := topic.Subscribe("g", "c", nop, pubsub.StartAt(pubsub.AtOffset(-1)))
					return g != nil, err
				}, pubsub.ErrInvalid},
				{"a Stream with an empty consumer name", "g", func() (bool, error) { s, err := topic.Stream("g", ""); return s != nil, err }, pubsub.ErrSubscription},
				{"a Stream with a negative MaxAttempts", "g", func() (bool, error) {
					s, err := topic.Stream("g", "c", pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: -1}))
					return s != nil, err
				}, pubsub.ErrInvalid},
			} {
				gotHandle, err := tc.join()
				c.wantIs("joining with "+tc.name, err, tc.want)
				if gotHandle {
					c.Errorf("joining with %s: got a handle alongside the error, want nil", tc.name)
				}
				if _, err := b.Lag(tc.group, "orders"); !errors.Is(err, pubsub.ErrSubscription) {
					c.Errorf("after joining with %s: Lag(%q) got %v, want ErrSubscription (no group)", tc.name, tc.group, err)
				}
			}
			rec := pubsubtest.NewRecorder[string]()
			g := subscribe(c, topic, "g", "c", rec)
			c.drain(b)
			if asg := g.Assignment(); len(asg) != 1 || rec.Len() != 1 {
				c.Errorf("a valid Subscribe after the failed ones: assignment %v and %d deliveries, want only c and the one record", asg, rec.Len())
			}
		}},
		{name: "NewTopic refuses a taken name with ErrTopicExists, whatever the types, and an impossible shape with ErrInvalid", run: func(c *conf) {
			b, topic := c.brokerTopic("orders", pubsub.WithPartitions(2))
			if other, err := pubsub.NewTopic(b, "orders", codec.Int[int](), codec.Bytes()); !errors.Is(err, pubsub.ErrTopicExists) || other != nil {
				c.Errorf("NewTopic of a taken name: got (%v, %v), want (nil, ErrTopicExists)", other, err)
			}
			if n := topic.Partitions(); n != 2 || topic.Name() != "orders" {
				c.Errorf("the topic that has the name: %q with %d partitions, want orders with 2", topic.Name(), n)
			}
			for _, n := range []int{0, -1, pubsub.MaxPartitions + 1} {
				_, err := pubsub.NewTopic(b, "shapes", codec.String(), codec.String(), pubsub.WithPartitions(n))
				c.wantIs(fmt.Sprintf("NewTopic with %d partitions", n), err, pubsub.ErrInvalid)
			}
			if _, err := pubsub.NewTopic(b, "shapes", codec.String(), codec.String()); err != nil {
				c.Errorf("NewTopic(\"shapes\") after the failed ones: got %v, want nil (the name is still free)", err)
			}
		}},
		{name: "a value or key the codec cannot encode fails the publish with ErrInvalid and appends nothing", run: func(c *conf) {
			b := c.broker()
			topic := newTopic(c, b, "orders", pickyStrings(), pickyStrings())
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "billing", "b1", rec)
			publish(c, topic, "k", "first")
			for name, err := range map[string]error{
				"Publish of an unencodable value":      second(topic.Publish(c.ctx(), "k", "unencodable")),
				"Publish of an unencodable key":        second(topic.Publish(c.ctx(), "unencodable", "v")),
				"PublishValue of an unencodable value": second(topic.PublishValue(c.ctx(), "unencodable")),
				"PublishBatch holding one": second(topic.PublishBatch(c.ctx(), []pubsub.Entry[string, string]{
					{Key: "k", Value: "fine"}, {Key: "k", Value: "unencodable"}})),
			} {
				c.wantIs(name, err, pubsub.ErrInvalid, errEncode)
			}
			if pos := publish(c, topic, "k", "second"); pos.Offset != 1 {
				c.Errorf("the next publish: got offset %d, want 1 (the failed ones took none)", pos.Offset)
			}
			c.drain(b)
			if got, want := rec.Values(), []string{"first", "second"}; !slices.Equal(got, want) {
				c.Errorf("delivered %q, want %q", got, want)
			}
		}},
		{name: "a Partitioner's answer out of range fails the publish with ErrInvalid and appends nothing", run: func(c *conf) {
			b := c.broker()
			topic := c.topic(b, "orders", pubsub.WithPartitions(2), pubsub.WithPartitioner(partitionerFunc(func(key []byte, n int) int {
				switch string(key) {
				case "too-far":
					return n
				case "negative":
					return -1
				}
				return 0
			})))
			publish(c, topic, "k", "first")
			for _, key := range []string{"too-far", "negative"} {
				pos, err := topic.Publish(c.ctx(), key, "v")
				c.wantIs("Publish routed to partition "+key, err, pubsub.ErrInvalid)
				if want := (pubsub.Position{Partition: -1, Offset: -1}); pos != want {
					c.Errorf("Publish routed to partition %s: got position %+v, want %+v", key, pos, want)
				}
			}
			if st := topic.Stats(); st.Published != 1 {
				c.Errorf("Published: got %d, want 1", st.Published)
			}
		}},
	}
}

func keyCases() []confCase {
	return []confCase{
		{name: "Topic.Key decodes a delivered message's key with the topic's key codec", run: func(c *conf) {
			b := c.broker()
			topic := newTopic(c, b, "accounts", codec.Int[int64](), codec.String(), pubsub.WithPartitions(3))
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "g", "c1", rec)
			want := map[string]int64{"a": 42, "b": -7, "c": 1 << 40}
			for v, k := range want {
				publish(c, topic, k, v)
			}
			c.drain(b)
			for _, m := range rec.Messages() {
				k, err := topic.Key(m)
				if err != nil || k != want[m.Value] {
					c.Errorf("Key of %q: got %d, %v; want %d, nil", m.Value, k, err, want[m.Value])
				}
			}
			if rec.Len() != len(want) {
				c.Errorf("got %d deliveries, want %d", rec.Len(), len(want))
			}
		}},
		{name: "Topic.Key of a keyless message, or of key bytes its codec cannot decode, is ErrInvalid", run: func(c *conf) {
			b := c.broker()
			topic := newTopic(c, b, "accounts", codec.Int[int64](), codec.String())
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "g", "c1", rec)
			publishValue(c, topic, "keyless")
			c.drain(b)
			msgs := rec.Messages()
			if len(msgs) != 1 || msgs[0].Key != nil {
				c.Fatalf("got %+v, want one keyless message with a nil Key", msgs)
			}
			k, err := topic.Key(msgs[0])
			c.wantIs("Key of a keyless message", err, pubsub.ErrInvalid)
			if k != 0 {
				c.Errorf("Key of a keyless message: got %d, want the zero key", k)
			}
			bad := msgs[0]
			bad.Key = []byte{1, 2, 3} // an Int[int64] key has 8 bytes
			_, err = topic.Key(bad)
			c.wantIs("Key of 3 bytes for an 8-byte codec", err, pubsub.ErrInvalid)
		}},
		{name: "a key that encodes to no bytes is still a key: hashed, and delivered as an empty, non-nil Key", run: func(c *conf) {
			b, topic := c.brokerTopic("orders", pubsub.WithPartitions(3))
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "g", "c1", rec)
			for i := range 3 {
				if pos := publish(c, topic, "", fmt.Sprint("keyed-", i)); pos.Partition != keyPartition("", 3) {
					c.Errorf("Publish with an empty key #%d: got partition %d, want %d (hashed, not round robin)", i, pos.Partition, keyPartition("", 3))
				}
			}
			c.drain(b)
			for _, m := range rec.Messages() {
				if m.Key == nil || len(m.Key) != 0 {
					c.Errorf("%s: Key %#v, want non-nil and empty", m.Value, m.Key)
				}
				if k, err := topic.Key(m); k != "" || err != nil {
					c.Errorf("%s: Topic.Key got %q, %v; want \"\", nil", m.Value, k, err)
				}
			}
		}},
	}
}
