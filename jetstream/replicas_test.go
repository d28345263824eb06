package jetstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

func TestWithReplicasValidation(t *testing.T) {
	for _, n := range []int{-1, 0, 6, 100} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			b := pubsub.NewBroker(pubsub.WithEngine(testServer.Engine(testOptions(WithReplicas(n))...)))
			defer b.Close(context.Background())
			if err := b.Err(); !errors.Is(err, pubsub.ErrInvalid) {
				t.Errorf("WithReplicas(%d): %v, want ErrInvalid", n, err)
			}
		})
	}
}

// More replicas than a server alone can keep: the server's error, saying
// what was asked for, when the broker opens (the membership bucket is
// the first thing it creates).
func TestReplicasOnAServerAlone(t *testing.T) {
	b := pubsub.NewBroker(pubsub.WithEngine(testServer.Engine(testOptions(WithReplicas(3))...)))
	defer b.Close(context.Background())
	err := b.Err()
	var api *natsjs.APIError
	if !errors.As(err, &api) || !strings.Contains(err.Error(), "WithReplicas(3)") || !strings.Contains(err.Error(), "not clustered") {
		t.Errorf("opening with WithReplicas(3) on a server alone: %v, want the server's error saying it is not clustered", err)
	}
}

// On a cluster of three, WithReplicas(3) makes every stream and bucket
// the engine creates R3, and the group's consumers with them; WithReplicas
// of another broker attaching to them changes nothing.
func TestClusterReplicas(t *testing.T) {
	needCluster(t)
	c := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc := c.connect("checker")
	js, err := natsjs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const parts = 6
	open := func(replicas int) *pubsub.Broker {
		eng, err := Connect(c.connect("broker"), WithPrefix("rep"), WithReplicas(replicas), WithMemberTTL(time.Second),
			WithPollWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		b := brokerOn(t, eng)
		if err := b.Err(); err != nil {
			t.Fatal(err)
		}
		topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(parts))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := topic.Subscribe("billing", fmt.Sprint("m", replicas), pubsub.HandlerFunc[string](
			func(context.Context, pubsub.Message[string]) error { return nil })); err != nil {
			t.Fatal(err)
		}
		return b
	}
	open(3)
	open(1) // attaches: keeps R3

	n := names{prefix: encodeName("rep")}
	var streams []string
	for p := range parts {
		streams = append(streams, n.stream("orders", p))
	}
	streams = append(streams, n.dlqStream("orders", "billing"), n.redriveStream("orders", "billing"),
		"KV_"+n.bucket(), "KV_"+n.bucket()+"_deals")
	for _, name := range streams {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if r := s.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas, want 3", name, r)
		}
		for ci := range s.ListConsumers(ctx).Info() {
			if ci.Config.Durable == "" {
				continue // a watcher's ordered consumer: R1 by the server's rule, and recreated when lost
			}
			if ci.Config.Replicas != 0 && ci.Config.Replicas != 3 || ci.Cluster == nil || len(ci.Cluster.Replicas) != 2 {
				t.Errorf("consumer %s of %s: %d replicas in its config, cluster %+v; want those of its stream", ci.Name, name,
					ci.Config.Replicas, ci.Cluster)
			}
		}
	}
	leads, err := leaders(ctx, js, streams[:parts]...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("leaders of the %d partition streams: %v", parts, leads)
}

// TestClusterLeadersSpread creates six topics of six partitions, each with a
// group, on a cluster of three: with R3 no server leads more than two of
// a topic's partition streams, nor of its group's consumers (the server
// alone often put four on one: cluster_test.go). R1 is logged: the
// server puts every R1 stream on the server with the most free storage,
// and the engine cannot move them.
func TestClusterLeadersSpread(t *testing.T) {
	needCluster(t)
	c := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	js, err := natsjs.New(c.connect("checker"))
	if err != nil {
		t.Fatal(err)
	}
	const parts = 6
	perNode := func(leads []string) []int {
		var counts []int
		for _, node := range c.names() {
			counts = append(counts, countOf(leads, node))
		}
		return counts
	}
	for _, replicas := range []int{1, 3} {
		prefix := fmt.Sprint("place", replicas)
		eng, err := Connect(c.connect("broker"), WithPrefix(prefix), WithReplicas(replicas))
		if err != nil {
			t.Fatal(err)
		}
		b := brokerOn(t, eng)
		n := names{prefix: encodeName(prefix)}
		for i := range 6 {
			name := fmt.Sprint("t", i)
			start := time.Now()
			topic, err := pubsub.NewTopic(b, name, codec.String(), codec.String(), pubsub.WithPartitions(parts))
			if err != nil {
				t.Fatal(err)
			}
			created := time.Since(start)
			if _, err := topic.Subscribe("g", "m", pubsub.HandlerFunc[string](
				func(context.Context, pubsub.Message[string]) error { return nil })); err != nil {
				t.Fatal(err)
			}
			t.Logf("R%d topic %s: NewTopic %v, Subscribe %v", replicas, name, created.Round(time.Millisecond),
				(time.Since(start) - created).Round(time.Millisecond))
			var streams, consumers []string
			for p := range parts {
				streams = append(streams, n.stream(name, p))
				ci, err := js.Consumer(ctx, n.stream(name, p), n.consumer("g", p))
				if err != nil {
					t.Fatal(err)
				}
				if cl := ci.CachedInfo().Cluster; cl != nil {
					consumers = append(consumers, cl.Leader)
				}
			}
			leads, err := leaders(ctx, js, streams...)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("R%d topic %s: stream leaders %v (per node %v), consumer leaders per node %v",
				replicas, name, leads, perNode(leads), perNode(consumers))
			if replicas == 3 && (slices.Max(perNode(leads)) > 2 || slices.Max(perNode(consumers)) > 2) {
				t.Errorf("R3 topic %s: streams led per node %v, consumers %v; want at most 2 of %d per node",
					name, perNode(leads), perNode(consumers), parts)
			}
		}
	}
}
