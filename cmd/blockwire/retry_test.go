package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/srp"
)

// A connection whose set-up failed below the target (RDMA/CM's
// CONNECT_ERROR: LIO's ib_srpt over siw did so now and then in the guest
// lab) is tried again, up to setupRetries times with a growing pause; an
// answer — a login rejected, a connection reset — is returned at once.
func TestSetupRetriedNotAnswers(t *testing.T) {
	ok := struct{ device }{}
	failed := fmt.Errorf("verbs: connection connect error (status -22): %w", rdma.ErrSetupFailed)
	log := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		name      string
		errs      []error // what each try returns; past them, success
		tries     int
		succeeded bool
	}{
		{"set-up fails twice", []error{failed, failed}, 3, true},
		{"set-up fails every time", []error{failed, failed, failed, failed, failed}, setupRetries + 1, false},
		{"login rejected", []error{&srp.LoginRej{Reason: srp.RejectAssociate}}, 1, false},
		{"reset", []error{errors.New("connection reset by peer")}, 1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tries := 0
			start := time.Now()
			d, err := retrySetup(context.Background(), log, setupRetries, func() (device, error) {
				tries++
				if tries <= len(c.errs) {
					return nil, c.errs[tries-1]
				}
				return ok, nil
			})
			if tries != c.tries || (err == nil) != c.succeeded || (c.succeeded && d != ok) {
				t.Fatalf("%d tries, err %v; want %d tries, success %v", tries, err, c.tries, c.succeeded)
			}
			if want := time.Duration(250<<(tries-1)-250) * time.Millisecond; time.Since(start) < want {
				t.Fatalf("%d tries in %v, want pauses of at least %v", tries, time.Since(start), want)
			}
		})
	}
	// A cancelled context ends the pauses.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tries := 0
	if _, err := retrySetup(ctx, log, setupRetries, func() (device, error) { tries++; return nil, failed }); !errors.Is(err, rdma.ErrSetupFailed) || tries != 1 {
		t.Fatalf("cancelled: %d tries, %v", tries, err)
	}
}
