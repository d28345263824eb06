package jetstream

// Replicas: every stream and bucket the engine creates is created with
// [WithReplicas]' count; one that exists keeps its own. Consumers carry no
// count of their own (0: their stream's), so a group's consumers are
// replicated as its topic's partitions are, whichever broker made them.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// createStream creates the stream cfg describes with the engine's replica
// count, or attaches to it when it exists with the same configuration up
// to its replica count and placement, which it keeps: two brokers whose
// [WithReplicas] differ must not scale a stream back and forth. Any other
// difference is natsjs.ErrStreamNameAlreadyInUse, for the caller to
// decide; with update set, it updates the stream instead, keeping the
// existing replicas (the dead-letter and redrive streams, which older
// versions made otherwise).
func (e *eng) createStream(ctx context.Context, cfg natsjs.StreamConfig, update bool) (natsjs.Stream, error) {
	cfg.Replicas = e.cfg.replicas
	s, err := e.js.CreateStream(ctx, cfg)
	if !errors.Is(err, natsjs.ErrStreamNameAlreadyInUse) {
		return s, e.replicasErr(err)
	}
	old, err := e.js.Stream(ctx, cfg.Name)
	if err != nil {
		return nil, err
	}
	cfg.Replicas, cfg.Placement = old.CachedInfo().Config.Replicas, old.CachedInfo().Config.Placement
	s, err = e.js.CreateStream(ctx, cfg)
	if errors.Is(err, natsjs.ErrStreamNameAlreadyInUse) && update {
		s, err = e.js.UpdateStream(ctx, cfg)
	}
	return s, err
}

// createBucket creates the KV bucket cfg describes with the engine's
// replica count, on file, or attaches to it when it exists; an existing
// bucket keeps its replica count and storage, and takes cfg's TTL
// (brokers that share a prefix must share a member TTL: the last to open
// sets it).
func (e *eng) createBucket(ctx context.Context, cfg natsjs.KeyValueConfig) (natsjs.KeyValue, error) {
	cfg.Replicas, cfg.Storage = e.cfg.replicas, natsjs.FileStorage
	kv, err := e.js.CreateKeyValue(ctx, cfg)
	if !errors.Is(err, natsjs.ErrBucketExists) {
		return kv, e.replicasErr(err)
	}
	old, err := e.js.KeyValue(ctx, cfg.Bucket)
	if err != nil {
		return nil, err
	}
	st, err := old.Status(ctx)
	if err != nil {
		return nil, err
	}
	bs, ok := st.(*natsjs.KeyValueBucketStatus)
	if !ok || bs.TTL() == cfg.TTL {
		return old, nil
	}
	cfg.Replicas, cfg.Storage = bs.StreamInfo().Config.Replicas, bs.StreamInfo().Config.Storage
	return e.js.UpdateKeyValue(ctx, cfg)
}

// replicasErr says, of an error the server gave for a stream or bucket
// the engine was creating, that it asked for more replicas than the
// server has to give, when that is what the error is.
func (e *eng) replicasErr(err error) error {
	var api *natsjs.APIError
	if e.cfg.replicas == 1 || !errors.As(err, &api) {
		return err
	}
	switch api.ErrorCode {
	case 10074: // JSStreamReplicasNotSupportedErr: a server that is not clustered
		return fmt.Errorf("%w (WithReplicas(%d) needs a cluster of at least %d JetStream servers; this server is not clustered)",
			err, e.cfg.replicas, e.cfg.replicas)
	case 10005, 10023: // JSClusterNoPeersErrF, JSInsufficientResourcesErr
		return fmt.Errorf("%w (WithReplicas(%d) needs %d JetStream servers of the cluster up and with room)",
			err, e.cfg.replicas, e.cfg.replicas)
	}
	return err
}

// leaderOf is a replicated asset whose Raft leader spreadLeaders may move:
// a stream or a consumer.
type leaderOf struct {
	stepdown string              // its leader stepdown API subject, after the API prefix
	cluster  *natsjs.ClusterInfo // as it was created; nil when not clustered
	info     func(context.Context) (*natsjs.ClusterInfo, error)
}

// spreadLeaders moves the Raft leaders of assets, all just created (a
// topic's partition streams, a group's consumers), so that no server leads
// more than its share of them, rounded up. The server picks each leader
// at random among the replicas, which often puts four of six partitions
// on one server of three (measured: cluster_test.go); where a topic's
// leaders are is where its publishes and pulls go, so an even spread
// shares the load, and a lost server stops a third of the partitions for
// an election, not most of them. It asks the leader of each asset on an
// overloaded server to step down in favour of the least loaded of its
// replicas (the server's stepdown with a preferred placement, nats-server
// 2.11 and later), and waits, bounded by ctx and a second in all, until each
// moved asset has a leader again. It is best effort: a request that fails
// (an older server, a replica not current) leaves that leader where it is.
func (e *eng) spreadLeaders(ctx context.Context, assets []leaderOf) {
	counts := map[string]int{}
	var moved []leaderOf
	var movable []int
	for i, a := range assets {
		if a.cluster == nil || a.cluster.Leader == "" || len(a.cluster.Replicas) == 0 {
			continue
		}
		counts[a.cluster.Leader]++
		for _, r := range a.cluster.Replicas {
			if _, ok := counts[r.Name]; !ok && !r.Offline {
				counts[r.Name] = 0
			}
		}
		movable = append(movable, i)
	}
	if len(counts) < 2 {
		return
	}
	share := (len(movable) + len(counts) - 1) / len(counts)
	prefix := apiPrefix(e.js)
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	for _, i := range movable {
		a := assets[i]
		from := a.cluster.Leader
		if counts[from] <= share {
			continue
		}
		// The replicas of an asset just created may not have answered its
		// leader yet, and the server moves a leader only to a replica it
		// heard from lately (else to any other): ask again until one has.
		to, wait := leastLoaded(a.cluster, counts, share)
		for to == "" && wait && wctx.Err() == nil {
			pause(wctx, 10*time.Millisecond)
			rctx, rcancel := context.WithTimeout(wctx, 200*time.Millisecond)
			fresh, err := a.info(rctx)
			rcancel()
			if err == nil && fresh != nil {
				if fresh.Leader != from {
					break // it moved by itself meanwhile
				}
				to, wait = leastLoaded(fresh, counts, share)
			}
		}
		if to == "" {
			continue
		}
		body := []byte(`{"placement":{"preferred":"` + to + `"}}`)
		resp, err := e.js.Conn().RequestWithContext(ctx, prefix+a.stepdown, body)
		var r struct {
			Success bool `json:"success"`
		}
		if err != nil || json.Unmarshal(resp.Data, &r) != nil || !r.Success {
			continue
		}
		counts[from]--
		counts[to]++
		moved = append(moved, a)
	}
	for _, a := range moved {
		for wctx.Err() == nil {
			rctx, rcancel := context.WithTimeout(wctx, 200*time.Millisecond)
			ci, err := a.info(rctx)
			rcancel()
			if err == nil && ci != nil && ci.Leader != "" {
				break
			}
			pause(wctx, 10*time.Millisecond)
		}
	}
}

// leastLoaded returns the replica of cl, heard from by its leader lately,
// that leads the fewest assets by counts, if that is fewer than share;
// "" when there is none, and then wait says whether a replica that leads
// fewer than share has not been heard from yet.
func leastLoaded(cl *natsjs.ClusterInfo, counts map[string]int, share int) (to string, wait bool) {
	for _, r := range cl.Replicas {
		switch {
		case r.Offline || counts[r.Name] >= share:
		case !r.Current:
			wait = true
		case to == "" || counts[r.Name] < counts[to]:
			to = r.Name
		}
	}
	return to, wait
}

// pause waits d, or until ctx ends: for what the server offers no event
// to wait on (an election, a replica catching up).
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
