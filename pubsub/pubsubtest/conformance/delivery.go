package conformance

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

func orderingCases() []confCase {
	return []confCase{
		{name: "records with equal keys share a partition and reach every group in publish order", run: func(c *conf) {
			b, topic := c.brokerTopic("orders", pubsub.WithPartitions(4))
			billing, audit := pubsubtest.NewRecorder[string](), pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "billing", "b1", billing)
			subscribe(c, topic, "billing", "b2", billing)
			subscribe(c, topic, "audit", "a1", audit)
			keys := []string{"alice", "bob", "carol", "dave", "erin"}
			partitionOf := map[string]int{}
			for i := range 20 {
				for _, k := range keys {
					pos := publish(c, topic, k, fmt.Sprintf("%s-%02d", k, i))
					if p, seen := partitionOf[k]; seen && p != pos.Partition {
						c.Fatalf("key %q: landed in partition %d, then %d; want one partition", k, p, pos.Partition)
					}
					partitionOf[k] = pos.Partition
				}
			}
			c.drain(b)
			for name, rec := range map[string]*pubsubtest.Recorder[string]{"billing": billing, "audit": audit} {
				byKey := map[string][]string{}
				for _, m := range rec.Messages() {
					byKey[string(m.Key)] = append(byKey[string(m.Key)], m.Value)
				}
				for _, k := range keys {
					var want []string
					for i := range 20 {
						want = append(want, fmt.Sprintf("%s-%02d", k, i))
					}
					if got := byKey[k]; !slices.Equal(got, want) {
						c.Errorf("group %s: key %q delivered as %q, want %q", name, k, got, want)
					}
				}
			}
		}},
		{name: "offsets in a partition are consecutive from 0 and a group's handler sees them in order, one at a time", run: func(c *conf) {
			const parts = 3
			b, topic := c.brokerTopic("events", pubsub.WithPartitions(parts), pubsub.WithPartitioner(pubsub.RoundRobin()))
			var (
				mu   sync.Mutex
				seen [parts][]int64
			)
			ov := newOverlaps(parts)
			subscribe(c, topic, "g", "c1", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
				if m.Partition < 0 || m.Partition >= parts {
					c.Errorf("delivery from partition %d of a %d-partition topic", m.Partition, parts)
					return nil
				}
				defer ov.enter(m.Partition)()
				mu.Lock()
				seen[m.Partition] = append(seen[m.Partition], m.Offset)
				mu.Unlock()
				return nil
			}))
			var next [parts]int64
			for i := range 60 {
				pos := publishValue(c, topic, fmt.Sprint(i))
				if pos.Partition < 0 || pos.Partition >= parts {
					c.Fatalf("publish %d: got partition %d, want one of %d", i, pos.Partition, parts)
				}
				if pos.Offset != next[pos.Partition] {
					c.Errorf("publish %d: got offset %d in partition %d, want %d", i, pos.Offset, pos.Partition, next[pos.Partition])
				}
				next[pos.Partition] = pos.Offset + 1
			}
			c.drain(b)
			ov.check(c, "handler calls")
			mu.Lock()
			defer mu.Unlock()
			for p := range parts {
				want := make([]int64, next[p])
				for i := range want {
					want[i] = int64(i)
				}
				if !slices.Equal(seen[p], want) {
					c.Errorf("partition %d: handler saw offsets %v, want %v", p, seen[p], want)
				}
			}
		}},
		{name: "a record being retried holds back the records behind it in its partition", run: func(c *conf) {
			b := c.broker(pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond}))
			topic := c.topic(b, "orders")
			log := &callLog[string]{fail: func(m pubsub.Message[string]) error {
				if m.Value == "a" && m.Attempt < 3 {
					return errBoom
				}
				return nil
			}}
			subscribe(c, topic, "billing", "b1", log)
			publishValues(c, topic, "a", "b", "c")
			c.drain(b)
			calls := log.all()
			if got, want := values(calls), []string{"a", "a", "a", "b", "c"}; !slices.Equal(got, want) {
				c.Errorf("handler calls: got %q, want %q", got, want)
			}
			if got, want := attempts(calls), []int{1, 2, 3, 1, 1}; !slices.Equal(got, want) {
				c.Errorf("attempts: got %v, want %v", got, want)
			}
		}},
		{name: "KeyHash sends a key to CRC-32 of its bytes modulo the partitions and spreads keyless records round robin", run: func(c *conf) {
			_, topic := c.brokerTopic("orders", pubsub.WithPartitions(3))
			for _, k := range []string{"alice", "bob", "carol", "dave", "", "zoë"} {
				if pos := publish(c, topic, k, "v"); pos.Partition != keyPartition(k, 3) {
					c.Errorf("key %q: got partition %d, want %d (CRC-32 mod 3)", k, pos.Partition, keyPartition(k, 3))
				}
			}
			var parts []int
			for range 7 {
				parts = append(parts, publishValue(c, topic, "keyless").Partition)
			}
			if !cyclic(parts, 3) {
				c.Errorf("keyless records went to partitions %v, want each next partition in turn", parts)
			}
		}},
		{name: "RoundRobin spreads records over the partitions in turn and ignores their keys", run: func(c *conf) {
			_, topic := c.brokerTopic("orders", pubsub.WithPartitions(3), pubsub.WithPartitioner(pubsub.RoundRobin()))
			var parts []int
			for range 4 {
				parts = append(parts, publish(c, topic, "same-key", "v").Partition)
			}
			for range 3 {
				parts = append(parts, publishValue(c, topic, "keyless").Partition)
			}
			if !cyclic(parts, 3) {
				c.Errorf("records went to partitions %v, want each next partition in turn, keyed or not", parts)
			}
		}},
		{name: "Sticky(n) hashes keyed records and sends n keyless records to one partition before moving on", run: func(c *conf) {
			_, topic := c.brokerTopic("orders", pubsub.WithPartitions(3), pubsub.WithPartitioner(pubsub.Sticky(2)))
			var parts []int
			for range 6 {
				parts = append(parts, publishValue(c, topic, "keyless").Partition)
			}
			if parts[0] != parts[1] || parts[2] != parts[3] || parts[4] != parts[5] || !cyclic([]int{parts[0], parts[2], parts[4]}, 3) {
				c.Errorf("Sticky(2) sent keyless records to partitions %v, want two to each partition in turn", parts)
			}
			if pos := publish(c, topic, "alice", "v"); pos.Partition != keyPartition("alice", 3) {
				c.Errorf("Sticky(2) sent key \"alice\" to partition %d, want %d (CRC-32 mod 3)", pos.Partition, keyPartition("alice", 3))
			}
		}},
		{name: "PublishBatch routes and orders records like one Publish each", run: func(c *conf) {
			b, topic := c.brokerTopic("orders", pubsub.WithPartitions(3))
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "billing", "b1", rec)
			var entries []pubsub.Entry[string, string]
			for i := range 5 {
				for _, k := range []string{"alice", "bob", "carol"} {
					entries = append(entries, pubsub.Entry[string, string]{Key: k, Value: fmt.Sprintf("%s-%d", k, i)})
				}
			}
			positions, err := topic.PublishBatch(c.ctx(), entries)
			if err != nil || len(positions) != len(entries) {
				c.Fatalf("PublishBatch: got %d positions and %v, want %d and nil", len(positions), err, len(entries))
			}
			for i, e := range entries {
				if positions[i].Partition != keyPartition(e.Key, 3) {
					c.Errorf("entry %d (key %q): got partition %d, want %d", i, e.Key, positions[i].Partition, keyPartition(e.Key, 3))
				}
			}
			c.drain(b)
			byKey := map[string][]string{}
			for _, m := range rec.Messages() {
				byKey[string(m.Key)] = append(byKey[string(m.Key)], m.Value)
			}
			for _, k := range []string{"alice", "bob", "carol"} {
				want := []string{k + "-0", k + "-1", k + "-2", k + "-3", k + "-4"}
				if !slices.Equal(byKey[k], want) {
					c.Errorf("key %q delivered as %q, want %q", k, byKey[k], want)
				}
			}
		}},
	}
}

func groupCases() []confCase {
	return []confCase{
		{name: "every group sees every record once", run: func(c *conf) {
			b, topic := c.brokerTopic("orders", pubsub.WithPartitions(4))
			recs := map[string]*pubsubtest.Recorder[string]{}
			for _, g := range []string{"billing", "audit", "search"} {
				recs[g] = pubsubtest.NewRecorder[string]()
				subscribe(c, topic, g, g+"-1", recs[g])
			}
			subscribe(c, topic, "search", "search-2", recs["search"])
			var want []string
			for i := range 40 {
				v := fmt.Sprintf("v%02d", i)
				want = append(want, v)
				publish(c, topic, fmt.Sprint("key-", i%7), v)
			}
			c.drain(b)
			for g, rec := range recs {
				got := rec.Values()
				slices.Sort(got)
				if !slices.Equal(got, want) {
					c.Errorf("group %s got %q, want each of %q once", g, got, want)
				}
			}
		}},
		{name: "inside a group each record goes to one consumer, the owner of its partition", run: func(c *conf) {
			b, topic := c.brokerTopic("orders", pubsub.WithPartitions(4))
			type call struct {
				consumer  string
				partition int
				value     string
			}
			var (
				mu    sync.Mutex
				calls []call
			)
			var g *pubsub.Group[string]
			for _, name := range []string{"c1", "c2", "c3"} {
				g = subscribe(c, topic, "billing", name, pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
					mu.Lock()
					defer mu.Unlock()
					calls = append(calls, call{name, m.Partition, m.Value})
					return nil
				}))
			}
			asg := g.Assignment()
			var want []string
			for i := range 40 {
				v := fmt.Sprintf("v%02d", i)
				want = append(want, v)
				publish(c, topic, fmt.Sprint("key-", i), v)
			}
			c.drain(b)
			mu.Lock()
			defer mu.Unlock()
			var got []string
			for _, cl := range calls {
				got = append(got, cl.value)
				if !slices.Contains(asg[cl.consumer], cl.partition) {
					c.Errorf("%s handled %s of partition %d, which it does not own (assignment %v)", cl.consumer, cl.value, cl.partition, asg)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				c.Errorf("the group handled %q, want each of %q once", got, want)
			}
		}},
		{name: "partitions are dealt out evenly and a rebalance moves only the partitions it must", run: func(c *conf) {
			const parts = 5
			_, topic := c.brokerTopic("orders", pubsub.WithPartitions(parts))
			nop := pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil })
			var g *pubsub.Group[string]
			var members []string
			prev := map[int]string{}
			// check verifies the assignment after a change, and that only
			// partitions of who (the member that joined or left) moved.
			check := func(change, who string) {
				c.Helper()
				asg := g.Assignment()
				owner := map[int]string{}
				lo, hi := parts, 0
				for _, m := range members {
					ps, ok := asg[m]
					if !ok {
						c.Errorf("after %s: assignment %v lacks member %s", change, asg, m)
					}
					lo, hi = min(lo, len(ps)), max(hi, len(ps))
					for _, p := range ps {
						if o, dup := owner[p]; dup {
							c.Errorf("after %s: partition %d owned by %s and %s", change, p, o, m)
						}
						owner[p] = m
					}
				}
				if len(asg) != len(members) {
					c.Errorf("after %s: assignment %v, want exactly members %v", change, asg, members)
				}
				if len(owner) != parts {
					c.Errorf("after %s: assignment %v leaves partitions unowned", change, asg)
				}
				if hi-lo > 1 {
					c.Errorf("after %s: shares range from %d to %d partitions, want them to differ by at most one (%v)", change, lo, hi, asg)
				}
				for p, o := range prev {
					if owner[p] != o && o != who && owner[p] != who {
						c.Errorf("after %s: partition %d moved from %s to %s, want only %s's partitions to move", change, p, o, owner[p], who)
					}
				}
				prev = owner
			}
			for i := range 7 { // more members than partitions: two own none
				name := fmt.Sprint("c", i+1)
				g = subscribe(c, topic, "billing", name, nop)
				members = append(members, name)
				check(name+" joined", name)
			}
			for _, name := range []string{"c2", "c5", "c1", "c7", "c3"} {
				if err := g.Leave(c.ctx(), name); err != nil {
					c.Fatalf("Leave(%s): %v", name, err)
				}
				members = slices.DeleteFunc(members, func(m string) bool { return m == name })
				check(name+" left", name)
			}
		}},
		{name: "no two consumers of a group hold one partition's deliveries at once, and a rebalance redelivers nothing", run: func(c *conf) {
			const parts = 4
			b, topic := c.brokerTopic("orders", pubsub.WithPartitions(parts))
			var (
				mu      sync.Mutex
				handled = map[string]int{}
				byKey   = map[string][]string{}
			)
			ov := newOverlaps(parts)
			h := pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
				defer ov.enter(m.Partition)()
				mu.Lock()
				handled[m.Value]++
				byKey[string(m.Key)] = append(byKey[string(m.Key)], m.Value)
				mu.Unlock()
				return nil
			})
			g := subscribe(c, topic, "billing", "c1", h)
			n := 0
			publishSome := func() {
				for range 60 {
					publish(c, topic, fmt.Sprint("key-", n%10), fmt.Sprintf("v%03d", n))
					n++
				}
			}
			publishSome()
			for _, step := range []struct {
				join  string
				leave string
			}{{join: "c2"}, {join: "c3"}, {leave: "c1"}, {join: "c4"}, {leave: "c2"}, {leave: "c3"}, {join: "c5"}} {
				if step.join != "" {
					subscribe(c, topic, "billing", step.join, h)
				} else if err := g.Leave(c.ctx(), step.leave); err != nil {
					c.Fatalf("Leave(%s): %v", step.leave, err)
				}
				publishSome()
			}
			c.drain(b)
			ov.check(c, "deliveries")
			mu.Lock()
			defer mu.Unlock()
			for i := range n {
				if v := fmt.Sprintf("v%03d", i); handled[v] != 1 {
					c.Errorf("%s handled %d times, want once (no failure, so no redelivery)", v, handled[v])
				}
			}
			for k, vs := range byKey {
				if !slices.IsSorted(vs) { // zero-padded: sorted is publish order
					c.Errorf("key %q delivered out of order: %q", k, vs)
				}
			}
		}},
		{name: "Subscribe to an existing group returns the same Group, and so does Stream.Group", run: func(c *conf) {
			_, topic := c.brokerTopic("orders")
			g1 := subscribe(c, topic, "billing", "b1", pubsubtest.NewRecorder[string]())
			g2 := subscribe(c, topic, "billing", "b2", pubsubtest.NewRecorder[string]())
			s := stream(c, topic, "billing", "b3")
			if g1 != g2 || s.Group() != g1 {
				c.Errorf("Subscribe twice and Stream gave groups %p, %p and %p, want one", g1, g2, s.Group())
			}
			if g1.Name() != "billing" {
				c.Errorf("Name: got %q, want billing", g1.Name())
			}
			if err := s.Close(); err != nil {
				c.Errorf("Stream.Close: %v", err)
			}
		}},
	}
}

func deliveryCases() []confCase {
	return []confCase{
		{name: "delivery is at least once and every redelivery follows a failed attempt with Attempt one higher", run: func(c *conf) {
			b := c.broker(pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond}))
			topic := newTopic(c, b, "orders", codec.String(), codec.Int[int](), pubsub.WithPartitions(2))
			// failures(i) is how many attempts on record i fail.
			failures := func(i int) int {
				switch {
				case i%5 == 0:
					return 2
				case i%3 == 0:
					return 1
				}
				return 0
			}
			log := &callLog[int]{fail: func(m pubsub.Message[int]) error {
				if m.Attempt <= failures(m.Value) {
					return errBoom
				}
				return nil
			}}
			g := subscribe(c, topic, "billing", "b1", log)
			const n = 30
			retried := 0
			for i := range n {
				publish(c, topic, fmt.Sprint("key-", i%4), i)
				retried += failures(i)
			}
			c.drain(b)
			byValue := map[int][]pubsub.Message[int]{}
			for _, m := range log.all() {
				byValue[m.Value] = append(byValue[m.Value], m)
			}
			ids := map[string]int{}
			for i := range n {
				calls := byValue[i]
				want := make([]int, failures(i)+1)
				for a := range want {
					want[a] = a + 1
				}
				if got := attempts(calls); !slices.Equal(got, want) {
					c.Errorf("record %d: attempts %v, want %v", i, got, want)
					continue
				}
				for _, m := range calls[1:] {
					if m.ID != calls[0].ID || m.Offset != calls[0].Offset || m.Partition != calls[0].Partition {
						c.Errorf("record %d: redelivered as ID %q at %d/%d, first as ID %q at %d/%d; want the same record",
							i, m.ID, m.Partition, m.Offset, calls[0].ID, calls[0].Partition, calls[0].Offset)
					}
				}
				if j, dup := ids[calls[0].ID]; dup {
					c.Errorf("records %d and %d share ID %q", j, i, calls[0].ID)
				}
				ids[calls[0].ID] = i
			}
			wantGroupStats(c, g, pubsub.GroupStats{Delivered: n, Retried: int64(retried)})
		}},
		{name: "a Message carries its topic, partition, offset, key, value, headers and Attempt 1", run: func(c *conf) {
			b, topic := c.brokerTopic("orders", pubsub.WithPartitions(2))
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "billing", "b1", rec)
			headers := map[string]string{"trace": "abc", "tenant": "t1"}
			before := time.Now()
			keyed := publish(c, topic, "alice", "paid", pubsub.WithHeaders(headers))
			keyless := publishValue(c, topic, "keyless")
			after := time.Now()
			headers["trace"] = "changed" // the record keeps its own copy
			delete(headers, "tenant")
			c.drain(b)
			msgs := rec.Messages()
			if len(msgs) != 2 {
				c.Fatalf("got %d deliveries, want 2", len(msgs))
			}
			slices.SortFunc(msgs, func(x, y pubsub.Message[string]) int { return cmp.Compare(x.Value, y.Value) })
			plain, paid := msgs[0], msgs[1]
			if paid.Topic != "orders" || paid.Partition != keyed.Partition || paid.Offset != keyed.Offset ||
				string(paid.Key) != "alice" || paid.Value != "paid" || paid.Attempt != 1 || paid.ID == "" {
				c.Errorf("keyed message: got %+v, want topic orders, position %+v, key alice, value paid, Attempt 1, an ID", paid, keyed)
			}
			if want := map[string]string{"trace": "abc", "tenant": "t1"}; !maps.Equal(paid.Headers, want) {
				c.Errorf("headers: got %v, want %v, as published", paid.Headers, want)
			}
			if paid.Created.Before(before.Add(-time.Second)) || paid.Created.After(after) {
				c.Errorf("Created %v, want it by the publish, between %v and %v", paid.Created, before, after)
			}
			if plain.Key != nil || plain.Partition != keyless.Partition || plain.Offset != keyless.Offset || len(plain.Headers) != 0 {
				c.Errorf("keyless message: got %+v, want Key nil, position %+v, no headers", plain, keyless)
			}
		}},
		{name: "a handler changing its Message changes nothing for another group", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "vandal", "v1", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
				if len(m.Key) > 0 {
					m.Key[0] = '#'
				}
				m.Headers["trace"] = "vandalised"
				return nil
			}))
			subscribe(c, topic, "billing", "b1", rec)
			publish(c, topic, "alice", "paid", pubsub.WithHeaders(map[string]string{"trace": "abc"}))
			c.drain(b)
			msgs := rec.Messages()
			if len(msgs) != 1 || string(msgs[0].Key) != "alice" || msgs[0].Headers["trace"] != "abc" {
				c.Errorf("billing got %+v, want key alice and trace abc, untouched by the other group", msgs)
			}
		}},
		{name: "Message.ID is non-empty, unique per record, and the same for every group and redelivery", run: func(c *conf) {
			b := c.broker(pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond}))
			topic := c.topic(b, "orders", pubsub.WithPartitions(2))
			flaky := &callLog[string]{fail: func(m pubsub.Message[string]) error {
				if m.Attempt == 1 {
					return errBoom
				}
				return nil
			}}
			steady := &callLog[string]{}
			subscribe(c, topic, "flaky", "f1", flaky)
			subscribe(c, topic, "steady", "s1", steady)
			for i := range 10 {
				publish(c, topic, fmt.Sprint("key-", i), fmt.Sprint(i))
			}
			c.drain(b)
			idOf := map[string]string{}
			for _, m := range steady.all() {
				idOf[m.Value] = m.ID
			}
			seen := map[string]bool{}
			for v, id := range idOf {
				if id == "" || seen[id] {
					c.Errorf("record %s: ID %q, want a non-empty ID no other record has", v, id)
				}
				seen[id] = true
			}
			if len(idOf) != 10 {
				c.Errorf("steady group got %d records, want 10", len(idOf))
			}
			for _, m := range flaky.all() {
				if m.ID != idOf[m.Value] {
					c.Errorf("record %s attempt %d: ID %q, want %q as the other group saw it", m.Value, m.Attempt, m.ID, idOf[m.Value])
				}
			}
		}},
		{name: "WithIDs names each record with the next ID of the source", needs: engine.CustomIDs, run: func(c *conf) {
			b := c.broker(pubsub.WithIDs(&seqIDs{}))
			topic := c.topic(b, "orders")
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "billing", "b1", rec)
			publishValues(c, topic, "a", "b", "c")
			c.drain(b)
			var got []string
			for _, m := range rec.Messages() {
				got = append(got, m.Value+"="+m.ID)
			}
			if want := []string{"a=id-1", "b=id-2", "c=id-3"}; !slices.Equal(got, want) {
				c.Errorf("IDs: got %q, want %q", got, want)
			}
		}},
		{name: "Message.Created is read from the broker's Clock", needs: engine.InjectedClock, run: func(c *conf) {
			clock, b, topic := c.clockedBrokerTopic("orders")
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "billing", "b1", rec)
			publishValue(c, topic, "first")
			clock.Advance(90 * time.Minute)
			publishValue(c, topic, "second")
			c.drain(b)
			msgs := rec.Messages()
			if len(msgs) != 2 || !msgs[0].Created.Equal(clockStart) || !msgs[1].Created.Equal(clockStart.Add(90*time.Minute)) {
				c.Errorf("got %+v, want Created %v then %v", msgs, clockStart, clockStart.Add(90*time.Minute))
			}
		}},
	}
}
