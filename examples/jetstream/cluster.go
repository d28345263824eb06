package main

// The -cluster mode: three NATS servers embedded in this process form a
// JetStream cluster on loopback, every stream, consumer and bucket the
// engine makes has three replicas (jetstream.WithReplicas(3)), and one
// server stops mid-run while orders flow.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/logbus/logbus/jetstream"
	"github.com/logbus/logbus/pubsub"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// clusterNode is one of the three servers: its name, its ports (picked at
// random once, kept across a restart), and its store.
type clusterNode struct {
	name              string
	port, clusterPort int
	dir               string
	routes            []string
	srv               *server.Server // nil while stopped
}

// start starts the node's server on its ports and store, and waits until
// it accepts connections.
func (n *clusterNode) start() error {
	srv, err := server.NewServer(&server.Options{
		ServerName: n.name, Host: "127.0.0.1", Port: n.port, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: n.dir,
		Cluster: server.ClusterOpts{Name: "demo", Host: "127.0.0.1", Port: n.clusterPort},
		Routes:  server.RoutesFromStr(strings.Join(n.routes, ",")),
	})
	if err != nil {
		return fmt.Errorf("%s: %w", n.name, err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return fmt.Errorf("%s: not ready after 10s", n.name)
	}
	n.srv = srv
	return nil
}

// stop shuts the node's server down and waits for it. A server that shuts
// down hands the leadership of what it led to the others first; one that
// crashes leaves them to elect new leaders, 4-9s later (see the jetstream
// package documentation).
func (n *clusterNode) stop() {
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
}

// freePorts returns n ports of 127.0.0.1 that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startCluster starts three servers on loopback, each with a store of its
// own under dir, and waits until they can place a stream of three
// replicas.
func startCluster(ctx context.Context, dir string) ([]*clusterNode, error) {
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	var routes []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[3+i]))
	}
	var nodes []*clusterNode
	for i := range 3 {
		n := &clusterNode{name: fmt.Sprintf("n%d", i+1), port: ports[i], clusterPort: ports[3+i],
			dir: filepath.Join(dir, fmt.Sprintf("n%d", i+1)), routes: routes}
		nodes = append(nodes, n)
		if err := n.start(); err != nil {
			stopAll(nodes)
			return nil, err
		}
	}
	if err := waitClusterReady(ctx, clusterURL(nodes)); err != nil {
		stopAll(nodes)
		return nil, err
	}
	return nodes, nil
}

func stopAll(nodes []*clusterNode) {
	for _, n := range nodes {
		n.stop()
	}
}

// clusterURL lists every node's client URL, for nats.Connect: a client
// connects to one and moves to another when it goes away.
func clusterURL(nodes []*clusterNode) string {
	var urls []string
	for _, n := range nodes {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", n.port))
	}
	return strings.Join(urls, ",")
}

// waitClusterReady waits until the cluster has elected its meta leader and
// knows all three servers: until it can create a stream of three
// replicas.
func waitClusterReady(ctx context.Context, url string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := natsjs.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, settle)
	defer cancel()
	for {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.CreateStream(rctx, natsjs.StreamConfig{Name: "READY", Subjects: []string{"ready"}, Replicas: 3,
			Storage: natsjs.MemoryStorage})
		if err == nil {
			err = js.DeleteStream(rctx, "READY")
		}
		rcancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the cluster is not ready: %w", err)
		case <-time.After(100 * time.Millisecond): // polling: forming a cluster is not an event a client can wait on
		}
	}
}

// runCluster is the -cluster demo, writing to out.
func runCluster(ctx context.Context, out io.Writer) (err error) {
	dir, err := os.MkdirTemp("", "logbus-jetstream-cluster-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(out, "logbus on a NATS JetStream cluster: three servers, three replicas of everything, one server stops mid-run")
	nodes, err := startCluster(ctx, dir)
	if err != nil {
		return err
	}
	defer stopAll(nodes)
	section(out, "three embedded NATS servers form a cluster on loopback, each with a store of its own")
	fmt.Fprintf(out, "servers %s; every stream, consumer and bucket the engine makes has 3 replicas\n",
		strings.Join([]string{nodes[0].name, nodes[1].name, nodes[2].name}, ", "))

	d := &demo{url: clusterURL(nodes), prefix: "demo", log: newHandled(),
		opts: []jetstream.Option{jetstream.WithReplicas(3)}}
	defer d.closeAll()
	a, err := d.replica("replica-a")
	if err != nil {
		return err
	}
	b, err := d.replica("replica-b")
	if err != nil {
		return err
	}
	pub, err := d.node("checkout")
	if err != nil {
		return err
	}
	if err := waitOwners(map[*replica][]int{a: nil, b: nil}); err != nil {
		return err
	}
	fmt.Fprintf(out, "replica-a owns partitions %v, replica-b %v\n", a.owned(), b.owned())
	lead, err := partitionLeaders(ctx, pub.nc, d.prefix)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  (varies with timing) the partitions' leaders: %v; the engine spreads them over the servers\n", lead)

	section(out, "24 orders, then the server leading most partitions stops while 24 more are published")
	first := batch(1)
	if err := publish(ctx, pub.topic, first); err != nil {
		return err
	}
	if err := drain(ctx, a.broker); err != nil {
		return err
	}
	fmt.Fprintf(out, "orders handled: %d, each once: %v\n", d.log.distinct(), d.log.duplicates() == 0)
	victim := mostLeading(nodes, lead)
	second := batch(100)
	type result struct {
		retried int
		err     error
	}
	published := make(chan result, 1)
	go func() { // exits when the 24 orders are published, or one failed for good
		n, err := publishRetrying(ctx, pub.topic, second)
		published <- result{n, err}
	}()
	victim.stop()
	stopped := time.Now()
	fmt.Fprintf(out, "  (varies with timing) %s stopped; it led partitions %v\n", victim.name, leading(lead, victim.name))
	res := <-published
	if res.err != nil {
		return fmt.Errorf("publishing while %s was down: %w", victim.name, res.err)
	}
	fmt.Fprintf(out, "publishing went on: all %d orders of the second batch were acknowledged\n", len(second))
	fmt.Fprintf(out, "  (varies with timing) %d publishes failed (their partition was changing leader) and were tried again\n", res.retried)
	if err := drain(ctx, a.broker); err != nil {
		return err
	}
	fmt.Fprintf(out, "consuming went on: all %d orders of both batches handled: %v\n", len(first)+len(second),
		d.log.distinctOrders() == len(first)+len(second))
	fmt.Fprintf(out, "  (varies with timing) records handled twice: %d; orders stored twice by a publish tried again: %d\n",
		d.log.duplicates(), d.log.storedTwice())
	fmt.Fprintf(out, "every record handled twice came again with a higher Attempt: %v\n", d.log.unexplained() == 0)
	fmt.Fprintf(out, "every customer's orders were handled in order: %v\n", d.log.inOrder())
	fmt.Fprintf(out, "  (varies with timing) both batches handled %v after %s stopped\n",
		time.Since(stopped).Round(10*time.Millisecond), victim.name)

	section(out, "while it is down, a third replica opens and joins the group")
	c, err := d.replica("replica-c")
	if err != nil {
		return fmt.Errorf("a broker opened while %s was down: %w", victim.name, err)
	}
	if err := waitOwners(map[*replica][]int{a: nil, b: nil, c: nil}); err != nil {
		return err
	}
	fmt.Fprintf(out, "replica-c joined: replica-a owns partitions %v, replica-b %v, replica-c %v\n", a.owned(), b.owned(), c.owned())
	third := batch(200)[:8]
	if _, err := publishRetrying(ctx, pub.topic, third); err != nil {
		return err
	}
	if err := drain(ctx, c.broker); err != nil {
		return err
	}
	fmt.Fprintf(out, "all %d orders handled: %v; every record handled twice with a higher Attempt: %v\n",
		len(first)+len(second)+len(third), d.log.distinctOrders() == len(first)+len(second)+len(third), d.log.unexplained() == 0)

	section(out, victim.name+" starts again on its store")
	if err := victim.start(); err != nil {
		return err
	}
	if err := waitCaughtUp(ctx, pub.nc, d.prefix, victim.name); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s is back and its replicas of the partitions caught up\n", victim.name)
	return nil
}

// publishRetrying publishes orders in order, giving each publish 5s and
// trying a failed one again, up to ten times: a publish to a partition
// whose leader is changing may go unanswered. A publish that failed may
// still have been stored (its outcome is unknown), so an order tried
// again may be stored twice: the demo counts those (storedTwice).
func publishRetrying(ctx context.Context, t *pubsub.Topic[string, Order], orders []Order) (retried int, err error) {
	for _, o := range orders {
		for try := 1; ; try++ {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := t.Publish(pctx, o.Customer, o)
			cancel()
			if err == nil {
				break
			}
			if try == 10 || ctx.Err() != nil {
				return retried, fmt.Errorf("publish %s: %w", o, err)
			}
			retried++
		}
	}
	return retried, nil
}

// partitionLeaders returns the name of the server leading each partition
// stream of the demo's topic.
func partitionLeaders(ctx context.Context, nc *nats.Conn, prefix string) ([]string, error) {
	js, err := natsjs.New(nc)
	if err != nil {
		return nil, err
	}
	var out []string
	for p := range partitions {
		info, err := partitionInfo(ctx, js, prefix, p)
		if err != nil {
			return nil, err
		}
		out = append(out, info.Cluster.Leader)
	}
	return out, nil
}

// partitionInfo reads the stream of partition p (named as the jetstream
// package documents: <prefix>_T_<topic>_P<p>).
func partitionInfo(ctx context.Context, js natsjs.JetStream, prefix string, p int) (*natsjs.StreamInfo, error) {
	s, err := js.Stream(ctx, fmt.Sprintf("%s_T_%s_P%d", prefix, topicName, p))
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	if info.Cluster == nil {
		return nil, errors.New("the stream has no cluster information")
	}
	return info, nil
}

// mostLeading returns the node that leads most partitions (the first on a
// tie).
func mostLeading(nodes []*clusterNode, lead []string) *clusterNode {
	best := nodes[0]
	for _, n := range nodes {
		if len(leading(lead, n.name)) > len(leading(lead, best.name)) {
			best = n
		}
	}
	return best
}

// leading returns the partitions whose leader is name.
func leading(lead []string, name string) []int {
	var ps []int
	for p, l := range lead {
		if l == name {
			ps = append(ps, p)
		}
	}
	return ps
}

// waitCaughtUp waits until name is a current replica of every partition
// stream, at most settle.
func waitCaughtUp(ctx context.Context, nc *nats.Conn, prefix, name string) error {
	js, err := natsjs.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, settle)
	defer cancel()
	for {
		current := 0
		for p := range partitions {
			info, err := partitionInfo(ctx, js, prefix, p)
			if err != nil {
				continue
			}
			if info.Cluster.Leader == name || slices.ContainsFunc(info.Cluster.Replicas, func(r *natsjs.PeerInfo) bool {
				return r.Name == name && r.Current
			}) {
				current++
			}
		}
		if current == partitions {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s caught up on %d of %d partitions: %w", name, current, partitions, ctx.Err())
		case <-time.After(50 * time.Millisecond): // polling: catching up is not an event a client can wait on
		}
	}
}
