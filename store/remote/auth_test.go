package remote

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

var (
	secretA = Secret("a shared secret of thirty bytes")
	secretB = Secret("another secret, of the same..")
)

// TestNeedsSecret: a server refuses to serve TCP, and a client to dial
// it, without a shared secret, each with an error that says why.
func TestNeedsSecret(t *testing.T) {
	t.Setenv(SecretEnv, "")
	srv, err := NewServer(newMem(t), ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	l, err := Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := srv.Serve(l); err == nil || !strings.Contains(err.Error(), "needs a shared secret") {
		t.Errorf("Serve(a tcp listener) without a secret = %v, want refused: it needs a shared secret", err)
	}
	if _, err := Dial(context.Background(), "tcp", addr, ClientOptions{}); err == nil || !strings.Contains(err.Error(), "needs a shared secret") {
		t.Errorf("Dial(tcp) without a secret = %v, want refused: it needs a shared secret", err)
	}
	if _, err := NewServer(newMem(t), ServerOptions{Secret: Secret("short")}); err == nil || !strings.Contains(err.Error(), "Secret of 5 bytes") {
		t.Errorf("NewServer with a secret of 5 bytes = %v, want an error naming Secret and its length", err)
	}
}

// TestSecretFromEnv: the options take the secret of SecretEnv when they
// carry none, and a server and a client with it talk over TCP.
func TestSecretFromEnv(t *testing.T) {
	t.Setenv(SecretEnv, string(secretA))
	o := serveRaw(t, ServerOptions{}, "tcp")
	c, err := Dial(context.Background(), "tcp", o.addr, ClientOptions{})
	if err != nil {
		t.Fatalf("Dial(tcp) with the secret of %s on both sides = %v", SecretEnv, err)
	}
	c.Close()
}

// TestSecret runs the handshake with each pairing of secrets: the same
// secret on both sides serves calls, over TCP and a unix socket; any
// other pairing fails Dial with an error that says why, and the server
// ends the connection saying why when it can tell.
func TestSecret(t *testing.T) {
	t.Setenv(SecretEnv, "")
	for _, tc := range []struct {
		name           string
		network        string
		server, client Secret
		dialErr        string // what Dial's error says; "" for none
		serverErr      string // what the server's says; "" for none
	}{
		{"TCP", "tcp", secretA, secretA, "", ""},
		{"Unix", "unix", secretA, secretA, "", ""},
		{"WrongTCP", "tcp", secretA, secretB, "server's proof of the shared secret is wrong", "client's proof of the shared secret is wrong"},
		{"WrongUnix", "unix", secretB, secretA, "server's proof of the shared secret is wrong", "client's proof of the shared secret is wrong"},
		{"ClientHasNone", "unix", secretA, nil, "requires a shared secret, and the client has none", "client's proof of the shared secret is wrong"},
		{"ServerHasNone", "unix", nil, secretA, "server does not prove a shared secret", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := serveRaw(t, ServerOptions{Secret: tc.server}, tc.network)
			c, err := Dial(context.Background(), tc.network, o.addr, ClientOptions{Secret: tc.client})
			if tc.dialErr == "" {
				if err != nil {
					t.Fatalf("Dial = %v, want the handshake done", err)
				}
				defer c.Close()
				mem, err := rdma.AllocHost(4096)
				if err != nil {
					t.Skipf("needs host memory: %v", err)
				}
				defer mem.Free()
				copy(mem.Bytes(), "value")
				if err := c.Register(mem.Region()); err != nil {
					t.Fatal(err)
				}
				res := make([]store.Result, 1)
				if err := c.Put(context.Background(), []string{"k"}, []rdma.Region{mem.Region()}, res); err != nil || res[0].Err != nil {
					t.Fatalf("Put = %v, %v", err, res[0].Err)
				}
				if err := c.Exists(context.Background(), []string{"k"}, res); err != nil || res[0].Err != nil {
					t.Fatalf("Exists after Put = %v, %v", err, res[0].Err)
				}
				return
			}
			if err == nil {
				c.Close()
				t.Fatalf("Dial succeeded, want it refused: %s", tc.dialErr)
			}
			if !strings.Contains(err.Error(), tc.dialErr) {
				t.Errorf("Dial = %v, want it to say %q", err, tc.dialErr)
			}
			for _, s := range []Secret{secretA, secretB} {
				if strings.Contains(err.Error(), string(s)) {
					t.Errorf("Dial's error %q shows a secret", err)
				}
			}
			if tc.serverErr != "" {
				o.waitEnded(t, tc.serverErr)
			}
		})
	}
}

// TestReplayedHello records a client's hello and proof on one connection
// and sends them again on another: the server draws a new nonce, and
// refuses the old proof.
func TestReplayedHello(t *testing.T) {
	o := serveRaw(t, ServerOptions{Secret: secretA}, "tcp")
	hello := frame(msgHello, 1, nonce(), nil)
	clientNonce := hello[headerLen : headerLen+nonceLen]
	handshake := func(nc net.Conn, auth []byte) (reply []byte) {
		t.Helper()
		if _, err := nc.Write(hello); err != nil {
			t.Fatal(err)
		}
		h, body := readFrame(t, nc)
		if h.typ != msgHelloReply {
			t.Fatalf("reply to a hello of type %d, want %d", h.typ, msgHelloReply)
		}
		serverNonce := body[len(body)-1-proofLen-nonceLen : len(body)-1-proofLen]
		if !checkProof(body[len(body)-proofLen:], secretA, labelServer, clientNonce, serverNonce) {
			t.Fatal("the server's proof of the secret does not check")
		}
		if auth == nil {
			auth = frame(msgAuth, 2, proof(secretA, labelClient, clientNonce, serverNonce), nil)
		}
		if _, err := nc.Write(auth); err != nil {
			t.Fatal(err)
		}
		h, body = readFrame(t, nc)
		if h.typ != msgReply {
			t.Fatalf("reply to a proof of type %d, want %d", h.typ, msgReply)
		}
		if err := replyError(body); err != nil {
			return []byte(err.Error())
		}
		return auth
	}
	auth := handshake(o.raw(t), nil)
	if got := handshake(o.raw(t), auth); !strings.Contains(string(got), "proof of the shared secret is wrong") {
		t.Errorf("a replayed hello and proof: the server answered %q, want the proof refused", got)
	}
	o.waitEnded(t, "client's proof of the shared secret is wrong")
}

// TestSecretHidden: a secret does not show in options printed whole, in
// any verb, nor in a log record, text or JSON.
func TestSecretHidden(t *testing.T) {
	so := ServerOptions{Secret: secretA}
	co := ClientOptions{Secret: secretA}
	var b strings.Builder
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%q", "%d"} {
		fmt.Fprintf(&b, verb+" "+verb+" "+verb+"\n", so, co, so.Secret)
	}
	slog.New(slog.NewTextHandler(&b, nil)).Info("options", "server", so, "secret", so.Secret)
	slog.New(slog.NewJSONHandler(&b, nil)).Info("options", "client", co, "secret", co.Secret)
	if out := b.String(); strings.Contains(out, string(secretA)) || strings.Contains(out, fmt.Sprintf("%x", []byte(secretA))) || strings.Contains(out, "97 32 115") || strings.Contains(out, base64.StdEncoding.EncodeToString(secretA)) {
		t.Errorf("the secret shows in:\n%s", out)
	}
}

func newMem(t *testing.T) store.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{Capacity: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
