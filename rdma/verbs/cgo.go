//go:build verbs && linux && cgo

package verbs

/*
#cgo LDFLAGS: -libverbs -lrdmacm
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

static int bw_nonblock(int fd) {
	int f = fcntl(fd, F_GETFL);
	if (f < 0) return -1;
	return fcntl(fd, F_SETFL, f | O_NONBLOCK);
}

// A completion as Go reads it: one cgo call polls a batch.
typedef struct {
	uint64_t id;
	uint32_t len, inv, vendor_err;
	int status, opcode, flags;
} bw_wc;

static int bw_poll(struct ibv_cq *cq, struct ibv_wc *wc, bw_wc *out, int n) {
	int k = ibv_poll_cq(cq, n, wc);
	for (int i = 0; i < k; i++) {
		out[i].id = wc[i].wr_id;
		out[i].len = wc[i].byte_len;
		out[i].inv = wc[i].invalidated_rkey;
		out[i].vendor_err = wc[i].vendor_err;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].flags = wc[i].wc_flags;
	}
	return k;
}

static int bw_arm(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

// bw_cq_event takes one event off the completion channel (non-blocking).
static int bw_cq_event(struct ibv_comp_channel *ch) {
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(ch, &cq, &ctx) != 0) return -1;
	ibv_ack_cq_events(cq, 1);
	return 0;
}

static int bw_post_send(struct ibv_qp *qp, uint64_t id, int op, int flags, uint32_t inv,
		uint64_t raddr, uint32_t rkey, struct ibv_sge *sg, int n) {
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = id;
	wr.sg_list = sg;
	wr.num_sge = n;
	wr.opcode = op;
	wr.send_flags = flags;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (op == IBV_WR_SEND_WITH_INV || op == IBV_WR_LOCAL_INV) {
		wr.invalidate_rkey = inv;
		// rdma-core's siw provider takes the STag to invalidate from
		// the RDMA fields (what it passes the kernel as the rkey).
		wr.wr.rdma.rkey = inv;
	}
	return ibv_post_send(qp, &wr, &bad);
}

// bw_post_bind binds a type 2 memory window over [addr, addr+len) of mr
// under rkey (its index with a new key byte).
static int bw_post_bind(struct ibv_qp *qp, uint64_t id, int flags, struct ibv_mw *mw, uint32_t rkey,
		struct ibv_mr *mr, uint64_t addr, uint64_t len, int access) {
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = flags;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info.mr = mr;
	wr.bind_mw.bind_info.addr = addr;
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = access;
	return ibv_post_send(qp, &wr, &bad);
}
static struct ibv_mw *bw_alloc_mw(struct ibv_pd *pd) { return ibv_alloc_mw(pd, IBV_MW_TYPE_2); }
static uint32_t bw_mw_rkey(struct ibv_mw *mw) { return mw->rkey; }
// A type 2 window's rkey is the consumer's to keep: the provider names the
// window by it in the next bind.
static void bw_mw_set_rkey(struct ibv_mw *mw, uint32_t rkey) { mw->rkey = rkey; }

static int bw_post_recv(struct ibv_qp *qp, uint64_t id, struct ibv_sge *sg) {
	struct ibv_recv_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = id;
	wr.sg_list = sg;
	wr.num_sge = 1;
	return ibv_post_recv(qp, &wr, &bad);
}

static struct ibv_sge *bw_sge(struct ibv_sge *sg, int i) { return &sg[i]; }

// A connection manager event as Go reads it.
typedef struct {
	struct rdma_cm_id *id, *listen_id;
	int event, status;
	uint8_t pdata[256];
	int pdata_len;
	int ird, ord;
} bw_event;

static int bw_get_event(struct rdma_event_channel *ch, bw_event *out) {
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev) != 0) return -1;
	out->id = ev->id;
	out->listen_id = ev->listen_id;
	out->event = ev->event;
	out->status = ev->status;
	out->pdata_len = 0;
	out->ird = out->ord = 0;
	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST || ev->event == RDMA_CM_EVENT_ESTABLISHED ||
	    ev->event == RDMA_CM_EVENT_REJECTED || ev->event == RDMA_CM_EVENT_CONNECT_RESPONSE) {
		int n = ev->param.conn.private_data_len;
		if (ev->param.conn.private_data == NULL) n = 0;
		if (n > 256) n = 256;
		if (n) memcpy(out->pdata, ev->param.conn.private_data, n);
		out->pdata_len = n;
		out->ird = ev->param.conn.responder_resources;
		out->ord = ev->param.conn.initiator_depth;
	}
	rdma_ack_cm_event(ev);
	return 0;
}

static int bw_sockaddr(struct sockaddr_storage *ss, int v6, const uint8_t *ip, uint16_t port, uint32_t scope) {
	memset(ss, 0, sizeof *ss);
	if (v6) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
		s->sin6_family = AF_INET6;
		s->sin6_port = htons(port);
		memcpy(&s->sin6_addr, ip, 16);
		s->sin6_scope_id = scope;
	} else {
		struct sockaddr_in *s = (struct sockaddr_in *)ss;
		s->sin_family = AF_INET;
		s->sin_port = htons(port);
		memcpy(&s->sin_addr, ip, 4);
	}
	return 0;
}

// bw_addr reads a sockaddr: family 4 or 6 (0: none), the address into ip
// (16 bytes), the port.
static int bw_addr(struct sockaddr *sa, uint8_t *ip, int *port) {
	if (sa == NULL) return 0;
	if (sa->sa_family == AF_INET) {
		struct sockaddr_in *s = (struct sockaddr_in *)sa;
		memcpy(ip, &s->sin_addr, 4);
		*port = ntohs(s->sin_port);
		return 4;
	}
	if (sa->sa_family == AF_INET6) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)sa;
		memcpy(ip, &s->sin6_addr, 16);
		*port = ntohs(s->sin6_port);
		return 6;
	}
	return 0;
}
static int bw_local_addr(struct rdma_cm_id *id, uint8_t *ip, int *port) { return bw_addr(rdma_get_local_addr(id), ip, port); }
static int bw_peer_addr(struct rdma_cm_id *id, uint8_t *ip, int *port) { return bw_addr(rdma_get_peer_addr(id), ip, port); }
// bw_path_dgid copies the peer's GID from the request's primary path (on
// RoCE the address the CM answers), or returns 0 when there is none.
static int bw_path_dgid(struct rdma_cm_id *id, uint8_t *gid) {
	if (id->route.num_paths < 1 || id->route.path_rec == NULL)
		return 0;
	memcpy(gid, &id->route.path_rec[0].dgid, 16);
	return 1;
}

static struct ibv_context *bw_id_verbs(struct rdma_cm_id *id) { return id->verbs; }
static uint8_t bw_id_port(struct rdma_cm_id *id) { return id->port_num; }

static int bw_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *cq, int sd, int rd, int sge, int inl) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = sd;
	a.cap.max_recv_wr = rd;
	a.cap.max_send_sge = sge;
	a.cap.max_recv_sge = 1;
	a.cap.max_inline_data = inl;
	a.sq_sig_all = 0;
	return rdma_create_qp(id, pd, &a);
}

// bw_join accepts a connection request or connects (retry_count is
// ignored when accepting).
static int bw_join(struct rdma_cm_id *id, const void *pd, int n, int ird, int ord, int accept) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof p);
	p.private_data = pd;
	p.private_data_len = n;
	p.responder_resources = ird;
	p.initiator_depth = ord;
	p.retry_count = 7;
	p.rnr_retry_count = 7;
	return accept ? rdma_accept(id, &p) : rdma_connect(id, &p);
}

static int bw_query(struct ibv_context *ctx, uint64_t *guid, int *transport, int *link, int *state, int *mtu,
		int *max_qp_rd_atom, int *ports, int *windows, uint32_t *vendor) {
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	if (ibv_query_device(ctx, &da) != 0) return -1;
	*vendor = da.vendor_id;
	*windows = da.max_mw > 0 && (da.device_cap_flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0;
	*guid = be64toh(da.node_guid);
	*transport = ctx->device->transport_type;
	*ports = da.phys_port_cnt;
	*max_qp_rd_atom = da.max_qp_rd_atom;
	if (ibv_query_port(ctx, 1, &pa) != 0) return -1;
	*link = pa.link_layer;
	*state = pa.state;
	*mtu = pa.active_mtu;
	return 0;
}
// An asynchronous event as Go reads it: the queue pair's number for a
// queue pair's event (hasqp), the port for a port's.
typedef struct {
	int type, hasqp, port;
	uint32_t qpn;
} bw_async;

static int bw_async_event(struct ibv_context *ctx, bw_async *out) {
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev) != 0) return -1;
	out->type = ev.event_type;
	out->hasqp = 0;
	out->port = 0;
	out->qpn = 0;
	switch (ev.event_type) {
	case IBV_EVENT_QP_FATAL: case IBV_EVENT_QP_REQ_ERR: case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST: case IBV_EVENT_SQ_DRAINED: case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR: case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->hasqp = 1;
		out->qpn = ev.element.qp->qp_num;
		break;
	case IBV_EVENT_PORT_ACTIVE: case IBV_EVENT_PORT_ERR: case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE: case IBV_EVENT_SM_CHANGE: case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		out->port = ev.element.port_num;
		break;
	default:
		break;
	}
	ibv_ack_async_event(&ev);
	return 0;
}
static int bw_async_fd(struct ibv_context *ctx) { return ctx->async_fd; }

static const char *bw_ctx_name(struct ibv_context *ctx) { return ibv_get_device_name(ctx->device); }
static struct ibv_context *bw_ctx_at(struct ibv_context **l, int i) { return l[i]; }
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/blockwire/blockwire/rdma"
)

// C handles in Go types.
type (
	cContext = C.struct_ibv_context
	cPD      = C.struct_ibv_pd
	cMR      = C.struct_ibv_mr
	cCQ      = C.struct_ibv_cq
	cChannel = C.struct_ibv_comp_channel
	cID      = C.struct_rdma_cm_id
	cEvChan  = C.struct_rdma_event_channel
	cSGE     = C.struct_ibv_sge
	cWC      = C.struct_ibv_wc
	cBWWC    = C.bw_wc
	cEvent   = C.bw_event
	cAsync   = C.bw_async
)

// Supported reports whether this build has the verbs device.
const Supported = true

// Devices lists the kernel's RDMA devices (rdma-core's view: what
// ibv_devices and rdma link show).
func Devices() ([]Info, error) {
	var n C.int
	l, err := C.rdma_get_devices(&n)
	if l == nil {
		if err == nil {
			err = errors.New("no device list")
		}
		return nil, fmt.Errorf("verbs: rdma_get_devices: %w", err)
	}
	defer C.rdma_free_devices(l)
	var out []Info
	for i := 0; i < int(n); i++ {
		out = append(out, query(C.bw_ctx_at(l, C.int(i))))
	}
	return out, nil
}

func query(ctx *cContext) Info {
	in := Info{Name: C.GoString(C.bw_ctx_name(ctx))}
	var guid C.uint64_t
	var transport, link, state, mtu, rd, ports, windows C.int
	var vendor C.uint32_t
	if C.bw_query(ctx, &guid, &transport, &link, &state, &mtu, &rd, &ports, &windows, &vendor) != 0 {
		in.State = "unknown (query failed)"
		return in
	}
	in.NodeGUID = uint64(guid)
	in.Ports = int(ports)
	in.MaxReadDepth = int(rd)
	in.MemoryWindows = windows != 0
	in.VendorID = uint32(vendor)
	switch {
	case transport == C.IBV_TRANSPORT_IWARP:
		in.Kind = "iWARP"
	case link == C.IBV_LINK_LAYER_ETHERNET:
		in.Kind = "RoCE"
	default:
		in.Kind = "InfiniBand"
	}
	in.State = portState(int(state))
	if mtu >= 1 && mtu <= 5 {
		in.MTU = 128 << int(mtu)
	}
	in.Netdev = netdevOf(in.Name, in.NodeGUID)
	return in
}

// Device is one kernel RDMA device opened through rdma-core: its verbs
// context, a protection domain, the registered memory of that domain and
// a connection manager event channel (RDMA_PS_TCP port space, the one
// Linux ib_iser, isert, ib_srp and ib_srpt use). It implements
// rdma.Fabric: Listen, Dial, and the queue pairs they make.
type Device struct {
	name string
	opts Options
	log  *slog.Logger
	ctx  *cContext
	cpd  *cPD
	mem  *memory
	pd   *rdma.PD
	info Info
	// windows: the initiator's memory is reached through memory windows,
	// a key per I/O (Options.Remote on a device that has them); the
	// memory itself is registered for local access and binding only.
	windows bool

	ech  *cEvChan
	echf *os.File // a duplicate of the event channel's fd, in the poller
	// A duplicate of the context's asynchronous event fd, in the poller;
	// asyncLoop is closed when its reader ends.
	asyncf    *os.File
	asyncLoop chan struct{}

	// mu guards ids and closed; it is taken alone, never across C calls
	// that wait.
	mu       sync.Mutex
	ids      map[*cID]owner
	closing  bool          // Close was called: the last id to go releases the device
	closed   bool          // released: no new id
	loop     chan struct{} // closed when the event loop ends
	relOnce  sync.Once
	released chan struct{}
}

// owner is what an rdma_cm_id's events go to.
type owner interface{ event(ev cmEvent) }

// cmEvent is a connection manager event, copied out of librdmacm.
type cmEvent struct {
	typ      int
	status   int
	id       *cID
	listen   *cID
	pdata    []byte
	ird, ord int
}

// Open opens the named RDMA device ("rxe0", "siw0", "mlx5_0"); "auto" is
// the only device when the kernel has exactly one.
func Open(name string, o Options) (*Device, error) {
	o.defaults()
	var n C.int
	l, err := C.rdma_get_devices(&n)
	if l == nil {
		return nil, fmt.Errorf("verbs: rdma_get_devices: %v (is ib_uverbs loaded, /dev/infiniband present?)", err)
	}
	defer C.rdma_free_devices(l)
	var ctx *cContext
	var names []string
	for i := 0; i < int(n); i++ {
		c := C.bw_ctx_at(l, C.int(i))
		nm := C.GoString(C.bw_ctx_name(c))
		names = append(names, nm)
		if nm == name || (name == "auto" && n == 1) {
			ctx = c
		}
	}
	if ctx == nil {
		switch {
		case n == 0:
			return nil, errors.New("verbs: no RDMA device (rdma link show lists none)")
		case name == "auto":
			return nil, fmt.Errorf("verbs: several RDMA devices %v: name one", names)
		}
		return nil, fmt.Errorf("verbs: no RDMA device %q (there are %v)", name, names)
	}
	d := &Device{opts: o, log: o.Logger, ctx: ctx, ids: map[*cID]owner{}, loop: make(chan struct{}), released: make(chan struct{})}
	d.info = query(ctx)
	d.name = d.info.Name
	if err := checkMemlock(d.name, o.MaxMemory); err != nil {
		return nil, fmt.Errorf("%w (device %s)", err, d.name)
	}
	if d.cpd, err = C.ibv_alloc_pd(ctx); d.cpd == nil {
		return nil, fmt.Errorf("verbs: %s: ibv_alloc_pd: %v", d.name, err)
	}
	access := rdma.LocalWrite
	d.windows = o.Remote && o.Windows && d.info.WindowsUsable()
	if o.Remote && !d.windows {
		access |= rdma.RemoteRead | rdma.RemoteWrite
	}
	d.mem = newMemory(d, access, o.MaxMemory)
	d.mem.log = d.log
	// One chunk now: a limit too small to register anything shows at
	// start, with its name, not as a later I/O error.
	b, ok := d.mem.Alloc(1)
	if !ok {
		err := d.mem.growLocked(minClassShift)
		C.ibv_dealloc_pd(d.cpd)
		return nil, fmt.Errorf("verbs: %s: registering memory: %w", d.name, err)
	}
	d.mem.Free(b)
	d.pd = rdma.NewHardwarePD(d.name, d.mem)
	if d.ech, err = C.rdma_create_event_channel(); d.ech == nil {
		d.mem.close()
		C.ibv_dealloc_pd(d.cpd)
		return nil, fmt.Errorf("verbs: rdma_create_event_channel: %v", err)
	}
	if d.echf, err = pollable(int(d.ech.fd), "rdma_cm"); err != nil {
		C.rdma_destroy_event_channel(d.ech)
		d.mem.close()
		C.ibv_dealloc_pd(d.cpd)
		return nil, err
	}
	if d.asyncf, err = pollable(int(C.bw_async_fd(ctx)), "asynchronous events"); err != nil {
		d.echf.Close()
		C.rdma_destroy_event_channel(d.ech)
		d.mem.close()
		C.ibv_dealloc_pd(d.cpd)
		return nil, err
	}
	d.asyncLoop = make(chan struct{})
	if o.Remote {
		how := "its registered memory under one key"
		switch {
		case d.windows:
			how = "a memory window per I/O over just its buffer"
		case o.Windows && d.info.MemoryWindows:
			how += " (memory windows are not used on " + d.name + ": rxe repeats window binds when it retransmits, which ends the connection)"
		case o.Windows:
			how += " (no memory windows on this device)"
		}
		d.log.Info("verbs: the peer reaches our buffers through "+how, "device", d.name)
	}
	go d.events()
	go d.asyncEvents()
	go d.forgetRemoved()
	return d, nil
}

// deviceListPoll is how often forgetRemoved reads the device list.
const deviceListPoll = 2 * time.Second

// forgetRemoved has librdmacm read the kernel's device list every
// deviceListPoll while the device is open. librdmacm keeps a context of
// every device it has seen (rdma_get_devices opens them all), and closes
// that of a device the kernel removed only when it next reads the list.
// A driver that cannot take a context away from a process (rxe, siw: no
// disassociation) finishes removing its device only then — this device,
// once its connections have ended (release reads the list too), and as
// well any other, which blockwire may never have used. With no device
// left, librdmacm closes none (its sync_devices_list returns ENODEV
// first: rdma-core 44 to at least 65): the host's last RDMA device is
// deleted when the process exits.
func (d *Device) forgetRemoved() {
	t := time.NewTicker(deviceListPoll)
	defer t.Stop()
	for {
		select {
		case <-d.released:
			return
		case <-t.C:
		}
		var n C.int
		if l := C.rdma_get_devices(&n); l != nil {
			C.rdma_free_devices(l)
		}
	}
}

// pollable returns the fd, made non-blocking, as a file the Go runtime's
// poller waits on (a duplicate: the library keeps and closes its own).
func pollable(fd int, name string) (*os.File, error) {
	if C.bw_nonblock(C.int(fd)) != 0 {
		return nil, fmt.Errorf("verbs: %s: cannot make the fd non-blocking", name)
	}
	dup, err := syscall.Dup(fd)
	if err != nil {
		return nil, fmt.Errorf("verbs: %s: dup: %w", name, err)
	}
	syscall.CloseOnExec(dup)
	return os.NewFile(uintptr(dup), name), nil
}

// register implements registrar.
func (d *Device) register(b []byte, access rdma.Access) (uint32, uint32, any, error) {
	flags := C.int(0)
	if access&rdma.LocalWrite != 0 {
		flags |= C.IBV_ACCESS_LOCAL_WRITE
	}
	if access&rdma.RemoteRead != 0 {
		flags |= C.IBV_ACCESS_REMOTE_READ
	}
	if access&rdma.RemoteWrite != 0 {
		flags |= C.IBV_ACCESS_REMOTE_WRITE | C.IBV_ACCESS_LOCAL_WRITE
	}
	if d.windows {
		flags |= C.IBV_ACCESS_MW_BIND
	}
	mr, err := C.ibv_reg_mr(d.cpd, unsafe.Pointer(unsafe.SliceData(b)), C.size_t(len(b)), flags)
	if mr == nil {
		if errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EAGAIN) {
			var rl syscall.Rlimit
			_ = syscall.Getrlimit(memlockResource, &rl)
			return 0, 0, nil, fmt.Errorf("verbs: %s: ibv_reg_mr of %d bytes: %v (RLIMIT_MEMLOCK is %d KiB: raise it with ulimit -l or LimitMEMLOCK=)",
				d.name, len(b), err, rl.Cur/1024)
		}
		return 0, 0, nil, fmt.Errorf("verbs: %s: ibv_reg_mr of %d bytes: %v", d.name, len(b), err)
	}
	return uint32(mr.lkey), uint32(mr.rkey), mr, nil
}

// deregister implements registrar.
func (d *Device) deregister(h any) { C.ibv_dereg_mr(h.(*cMR)) }

// Name is the device's name.
func (d *Device) Name() string { return d.name }

// Info describes the device.
func (d *Device) Info() Info { return d.info }

// PD is the device's protection domain, with its registered memory:
// buffers from PD().Alloc move without a copy.
func (d *Device) PD() *rdma.PD { return d.pd }

// Memory is the device's registered memory (for buffer pools: what it
// hands out moves without a copy).
func (d *Device) Memory() rdma.Memory { return d.mem }

// Close ends the event loop and frees the device's resources; queue pairs
// and listeners must be closed first.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closing {
		d.mu.Unlock()
		return nil
	}
	// Connections still closing (their flushes drain) end first: their
	// ids need the event channel, and their queue pairs the memory and
	// the PD, until destroyed. The last one to go releases the device.
	d.closing = true
	n := len(d.ids)
	d.mu.Unlock()
	if n == 0 {
		d.release()
		return nil
	}
	select {
	case <-d.released:
	case <-time.After(5 * time.Second):
		// Connections still tearing down (an iWARP close waits for TCP):
		// not an error; the last to go releases the device.
		d.log.Info("verbs: device closed with connections still ending: released when the last ends", "device", d.name, "ids", n)
	}
	return nil
}

// release frees the device once no id is left.
func (d *Device) release() {
	d.relOnce.Do(func() {
		d.mu.Lock()
		d.closed = true
		d.mu.Unlock()
		d.echf.Close() // wakes the event loop
		<-d.loop
		d.asyncf.Close()
		<-d.asyncLoop
		C.rdma_destroy_event_channel(d.ech)
		d.mem.close()
		C.ibv_dealloc_pd(d.cpd)
		// librdmacm closes the context of a device the kernel removed
		// once nothing uses it, when it next looks at the device list;
		// a device being removed waits for that close.
		var n C.int
		if l := C.rdma_get_devices(&n); l != nil {
			C.rdma_free_devices(l)
		}
		close(d.released)
	})
}

// events reads the connection manager's events and hands each to the
// owner of its id.
func (d *Device) events() {
	defer close(d.loop)
	var ev cEvent
	drain(d, d.echf, "rdma_get_cm_event", func() (cmEvent, error) {
		if r, err := C.bw_get_event(d.ech, &ev); r != 0 {
			return cmEvent{}, cerr(err)
		}
		e := cmEvent{typ: int(ev.event), status: int(ev.status), id: ev.id, listen: ev.listen_id,
			ird: int(ev.ird), ord: int(ev.ord)}
		if ev.pdata_len > 0 {
			e.pdata = C.GoBytes(unsafe.Pointer(&ev.pdata[0]), ev.pdata_len)
		}
		return e, nil
	}, d.dispatch)
}

// asyncEvents reads the device's asynchronous events. A queue pair's
// error — the kernel moved it to the error state without a failed work
// request of ours to say why, as when the peer's RDMA Write or Read
// touched memory it was not given — ends that connection with the reason
// in the log; port and device errors are logged.
func (d *Device) asyncEvents() {
	defer close(d.asyncLoop)
	var ev cAsync
	drain(d, d.asyncf, "ibv_get_async_event", func() (cAsync, error) {
		if r, err := C.bw_async_event(d.ctx, &ev); r != 0 {
			return cAsync{}, cerr(err)
		}
		return ev, nil
	}, d.asyncEvent)
}

// drain waits on f, a library's fd in the runtime's poller, reads what
// get takes off it (up to 16 at a time, until it would block) and hands
// each to handle, until f is closed.
func drain[T any](d *Device, f *os.File, what string, get func() (T, error), handle func(T)) {
	rc, err := f.SyscallConn()
	if err != nil {
		d.log.Error("verbs: "+what, "device", d.name, "err", err)
		return
	}
	for {
		var items []T
		rerr := rc.Read(func(uintptr) bool {
			for len(items) < 16 {
				it, err := get()
				if err != nil {
					if errors.Is(err, syscall.EAGAIN) {
						return len(items) > 0
					}
					d.log.Error("verbs: "+what, "device", d.name, "err", err)
					return true
				}
				items = append(items, it)
			}
			return true
		})
		for _, it := range items {
			handle(it)
		}
		if rerr != nil {
			return // closed
		}
	}
}

// cerr is a failed C call's errno, never nil.
func cerr(err error) error {
	if err == nil {
		return syscall.EIO
	}
	return err
}

func (d *Device) asyncEvent(e cAsync) {
	what := C.GoString(C.ibv_event_type_str(uint32(e._type)))
	switch {
	case e.hasqp != 0:
		switch e._type {
		case C.IBV_EVENT_QP_FATAL, C.IBV_EVENT_QP_REQ_ERR, C.IBV_EVENT_QP_ACCESS_ERR, C.IBV_EVENT_PATH_MIG_ERR:
		default:
			return // progress, not errors
		}
		hint := "the queue pair failed"
		switch e._type {
		case C.IBV_EVENT_QP_ACCESS_ERR:
			hint = "the peer's RDMA operation reached for memory it was not given"
		case C.IBV_EVENT_QP_REQ_ERR:
			// siw reports an RDMA Write under an unknown STag so.
			hint = "the device refused a request of the peer's (an RDMA operation outside memory it was given, or a malformed request)"
		}
		q := d.qpByNum(uint32(e.qpn))
		if q == nil {
			// The connection ended first (the peer's disconnect, or its
			// TERMINATE, came before the event): what the device
			// refused is still said.
			d.log.Warn("verbs: queue pair error: the connection had already ended", "device", d.name, "qpn", uint32(e.qpn),
				"event", what, "reason", hint)
			return
		}
		// A connection already ending (the peer disconnected, or Close)
		// may see its queue pair fail so (siw: a catastrophic error as a
		// logout's disconnect tears it down): that is its end, not a fault.
		level := slog.LevelWarn
		if q.stopped() {
			level = slog.LevelDebug
		}
		d.log.Log(context.Background(), level, "verbs: queue pair error: the connection ends", "device", d.name, "peer", q.attr.RemoteAddr,
			"event", what, "reason", hint)
		q.fail(fmt.Errorf("verbs: %s: %s (%s)", d.name, what, hint))
	case e._type == C.IBV_EVENT_DEVICE_FATAL:
		d.log.Error("verbs: RDMA device fatal error", "device", d.name, "event", what)
	case e._type == C.IBV_EVENT_PORT_ERR:
		d.log.Warn("verbs: RDMA device port down", "device", d.name, "port", int(e.port))
	case e._type == C.IBV_EVENT_PORT_ACTIVE:
		d.log.Info("verbs: RDMA device port active", "device", d.name, "port", int(e.port))
	default:
		d.log.Debug("verbs: asynchronous event", "device", d.name, "event", what, "port", int(e.port))
	}
}

// qpByNum is the queue pair of ours with that number, if any.
func (d *Device) qpByNum(n uint32) *qp {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, o := range d.ids {
		if q, ok := o.(*qp); ok && q.num == n {
			return q
		}
	}
	return nil
}

func (d *Device) dispatch(e cmEvent) {
	if e.typ == C.RDMA_CM_EVENT_DEVICE_REMOVAL {
		// Every connection on the device ends now, with its line in the
		// log, not only those whose own event comes.
		d.mu.Lock()
		var qs []*qp
		for _, o := range d.ids {
			if q, ok := o.(*qp); ok {
				qs = append(qs, q)
			}
		}
		d.mu.Unlock()
		for _, q := range qs {
			q.deviceRemoved()
		}
	}
	d.mu.Lock()
	var o owner
	if e.typ == C.RDMA_CM_EVENT_CONNECT_REQUEST {
		o = d.ids[e.listen]
	} else {
		o = d.ids[e.id]
	}
	d.mu.Unlock()
	if o != nil {
		o.event(e)
		return
	}
	if e.typ == C.RDMA_CM_EVENT_CONNECT_REQUEST {
		// A request for a listener that is gone.
		C.rdma_reject(e.id, nil, 0)
		go C.rdma_destroy_id(e.id)
	}
}

func (d *Device) own(id *cID, o owner) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.closing {
		return errClosed
	}
	d.ids[id] = o
	return nil
}

func (d *Device) disown(id *cID) {
	d.mu.Lock()
	delete(d.ids, id)
	last := d.closing && len(d.ids) == 0
	d.mu.Unlock()
	if last {
		go d.release()
	}
}

// destroyID destroys an id and then forgets it. Not on the event loop:
// rdma_destroy_id waits for the id's events to be acknowledged there.
func (d *Device) destroyID(id *cID) {
	C.rdma_destroy_id(id)
	d.disown(id)
}

var eventNames = map[int]string{
	C.RDMA_CM_EVENT_ADDR_RESOLVED: "address resolved", C.RDMA_CM_EVENT_ADDR_ERROR: "address error",
	C.RDMA_CM_EVENT_ROUTE_RESOLVED: "route resolved", C.RDMA_CM_EVENT_ROUTE_ERROR: "route error",
	C.RDMA_CM_EVENT_CONNECT_REQUEST: "connect request", C.RDMA_CM_EVENT_CONNECT_RESPONSE: "connect response",
	C.RDMA_CM_EVENT_CONNECT_ERROR: "connect error", C.RDMA_CM_EVENT_UNREACHABLE: "unreachable",
	C.RDMA_CM_EVENT_REJECTED: "rejected", C.RDMA_CM_EVENT_ESTABLISHED: "established",
	C.RDMA_CM_EVENT_DISCONNECTED: "disconnected", C.RDMA_CM_EVENT_DEVICE_REMOVAL: "device removal",
	C.RDMA_CM_EVENT_TIMEWAIT_EXIT: "timewait exit", C.RDMA_CM_EVENT_ADDR_CHANGE: "address change",
}

func eventName(t int) string {
	if n, ok := eventNames[t]; ok {
		return n
	}
	return fmt.Sprintf("event %d", t)
}

// sockaddr encodes ap for librdmacm (C memory the caller frees).
func sockaddr(ap netip.AddrPort) *C.struct_sockaddr {
	ss := (*C.struct_sockaddr_storage)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_sockaddr_storage{}))))
	a := ap.Addr()
	var ip [16]byte
	v6 := C.int(0)
	if a.Is4() || a.Is4In6() {
		a4 := a.Unmap().As4()
		copy(ip[:], a4[:])
	} else {
		ip = a.As16()
		v6 = 1
	}
	scope := uint32(0)
	if z := a.Zone(); z != "" {
		if ifi, err := net.InterfaceByName(z); err == nil {
			scope = uint32(ifi.Index)
		}
	}
	cip := (*C.uint8_t)(C.CBytes(ip[:]))
	defer C.free(unsafe.Pointer(cip))
	C.bw_sockaddr(ss, v6, cip, C.uint16_t(ap.Port()), C.uint32_t(scope))
	return (*C.struct_sockaddr)(unsafe.Pointer(ss))
}

func idAddr(id *cID, local bool) net.Addr {
	var ip [16]C.uint8_t
	var port C.int
	var fam C.int
	if local {
		fam = C.bw_local_addr(id, &ip[0], &port)
	} else {
		fam = C.bw_peer_addr(id, &ip[0], &port)
	}
	b := C.GoBytes(unsafe.Pointer(&ip[0]), 16)
	switch fam {
	case 4:
		return &net.TCPAddr{IP: net.IP(b[:4]), Port: int(port)}
	case 6:
		return &net.TCPAddr{IP: net.IP(b), Port: int(port)}
	}
	return nil
}

// claimed says why a connection request on a RoCE device must be refused
// for the address it claims, or "". librdmacm reports the peer address
// the RDMA/CM header in the peer's REQ names — whatever the peer wrote —
// while the CM answers the GID of the REQ's primary path: a peer that
// named another address there would never see the answer. A request
// whose two disagree is a peer passing for an address it does not hold
// (an ACL's from, the per-source bounds), and is refused. On InfiniBand
// a GID is no IP address and there is nothing to compare; iWARP's address
// is its TCP connection's.
func (d *Device) claimed(id *cID, remote net.Addr) string {
	ta, ok := remote.(*net.TCPAddr)
	if d.info.Kind != "RoCE" || !ok {
		return ""
	}
	var g [16]C.uint8_t
	if C.bw_path_dgid(id, &g[0]) == 0 {
		return ""
	}
	gid := netip.AddrFrom16([16]byte(C.GoBytes(unsafe.Pointer(&g[0]), 16))).Unmap()
	claim, _ := netip.AddrFromSlice(ta.IP)
	if claim.Unmap() == gid {
		return ""
	}
	return fmt.Sprintf("its RDMA/CM header claims the address %s, its path is to %s", claim.Unmap(), gid)
}

func parseAddr(addr string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if host == "" {
		host = "0.0.0.0"
	}
	ap, err := netip.ParseAddrPort(net.JoinHostPort(host, port))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("verbs: %q: an RDMA address is an IP address and a port: %w", addr, err)
	}
	return ap, nil
}

// DeviceFor names the kernel RDMA device an address belongs to ("" when
// none: no RDMA device sits on its network interface).
func DeviceFor(addr string) (string, error) {
	ap, err := parseAddr(addr)
	if err != nil {
		return "", err
	}
	var id *cID
	if r, err := C.rdma_create_id(nil, &id, nil, C.RDMA_PS_TCP); r != 0 {
		return "", fmt.Errorf("verbs: rdma_create_id: %v (is rdma_ucm loaded?)", err)
	}
	defer C.rdma_destroy_id(id)
	sa := sockaddr(netip.AddrPortFrom(ap.Addr(), 0))
	defer C.free(unsafe.Pointer(sa))
	if r, _ := C.rdma_bind_addr(id, sa); r != 0 {
		return "", nil
	}
	if v := C.bw_id_verbs(id); v != nil {
		return C.GoString(C.bw_ctx_name(v)), nil
	}
	return "", nil
}

// ---- listening ----

type listener struct {
	d    *Device
	id   *cID
	addr net.Addr
	reqs chan *request
	done chan struct{}
	once sync.Once
	gone error // set before done closes: the device went away
}

// Listen implements rdma.Fabric: RDMA/CM requests to addr (port space
// TCP: the service ID is 0x0106<<16 | port) on this device. A wildcard
// address takes requests arriving on any device; those on another device
// are rejected.
func (d *Device) Listen(addr string) (rdma.Listener, error) {
	ap, err := parseAddr(addr)
	if err != nil {
		return nil, err
	}
	var id *cID
	if r, err := C.rdma_create_id(d.ech, &id, nil, C.RDMA_PS_TCP); r != 0 {
		return nil, fmt.Errorf("verbs: rdma_create_id: %v", err)
	}
	sa := sockaddr(ap)
	defer C.free(unsafe.Pointer(sa))
	if r, err := C.rdma_bind_addr(id, sa); r != 0 {
		C.rdma_destroy_id(id)
		return nil, fmt.Errorf("verbs: listen on %s: rdma_bind_addr: %v", addr, err)
	}
	if v := C.bw_id_verbs(id); v != nil && v != d.ctx {
		C.rdma_destroy_id(id)
		return nil, fmt.Errorf("verbs: %s belongs to RDMA device %s, not %s", addr, C.GoString(C.bw_ctx_name(v)), d.name)
	}
	l := &listener{d: d, id: id, reqs: make(chan *request, d.opts.Backlog), done: make(chan struct{})}
	if err := d.own(id, l); err != nil {
		C.rdma_destroy_id(id)
		return nil, err
	}
	if r, err := C.rdma_listen(id, C.int(d.opts.Backlog)); r != 0 {
		d.destroyID(id)
		return nil, fmt.Errorf("verbs: rdma_listen on %s: %v", addr, err)
	}
	l.addr = idAddr(id, true)
	return l, nil
}

func (l *listener) event(e cmEvent) {
	switch e.typ {
	case C.RDMA_CM_EVENT_CONNECT_REQUEST:
		if v := C.bw_id_verbs(e.id); v != l.d.ctx {
			l.d.log.Warn("verbs: connection request on another RDMA device refused", "device", l.d.name, "on", C.GoString(C.bw_ctx_name(v)))
			C.rdma_reject(e.id, nil, 0)
			go C.rdma_destroy_id(e.id)
			return
		}
		r := &request{d: l.d, id: e.id, pdata: e.pdata, ird: e.ird, ord: e.ord}
		r.local, r.remote = idAddr(e.id, true), idAddr(e.id, false)
		if why := l.d.claimed(e.id, r.remote); why != "" {
			l.d.log.Warn("verbs: connection request refused: "+why, "from", r.remote)
			C.rdma_reject(e.id, nil, 0)
			go l.d.destroyID(e.id)
			return
		}
		if err := l.d.own(e.id, r); err != nil {
			C.rdma_reject(e.id, nil, 0)
			go C.rdma_destroy_id(e.id)
			return
		}
		select {
		case l.reqs <- r:
		default:
			// Requests not yet taken are bounded (Options.Backlog).
			l.d.log.Warn("verbs: connection request refused: backlog full", "from", r.remote, "backlog", l.d.opts.Backlog)
			C.rdma_reject(e.id, nil, 0)
			go l.d.destroyID(e.id)
		}
	case C.RDMA_CM_EVENT_DEVICE_REMOVAL:
		l.gone = fmt.Errorf("verbs: %s: %w", l.d.name, ErrDeviceRemoved)
		l.d.log.Error("verbs: RDMA device removed: the listener stops", "device", l.d.name, "addr", l.addr)
		l.close()
	}
}

func (l *listener) Accept(ctx context.Context) (rdma.ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.done:
		if l.gone != nil {
			return nil, l.gone
		}
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *listener) Addr() net.Addr { return l.addr }

func (l *listener) Close() error {
	l.close()
	return nil
}

func (l *listener) close() {
	l.once.Do(func() {
		close(l.done)
		// rdma_destroy_id waits for the id's events to be acknowledged;
		// the event loop acknowledges each at once, but may be the
		// caller (device removal): destroy off its goroutine.
		go l.d.destroyID(l.id)
		for {
			select {
			case r := <-l.reqs:
				r.Reject(nil)
			default:
				return
			}
		}
	})
}

// request is a connection request not yet accepted or rejected.
type request struct {
	d             *Device
	id            *cID
	pdata         []byte
	ird, ord      int
	local, remote net.Addr
	once          sync.Once
}

// event: before Accept makes the queue pair (which then owns the id),
// only a device removal or the peer giving up can come.
func (r *request) event(cmEvent) {}

func (r *request) PrivateData() []byte  { return r.pdata }
func (r *request) PeerIRD() int         { return r.ord }
func (r *request) PeerORD() int         { return r.ird }
func (r *request) LocalAddr() net.Addr  { return r.local }
func (r *request) RemoteAddr() net.Addr { return r.remote }

func (r *request) Reject(privateData []byte) error {
	r.once.Do(func() {
		var p unsafe.Pointer
		if len(privateData) > 0 {
			p = C.CBytes(privateData)
			defer C.free(p)
		}
		C.rdma_reject(r.id, p, C.uint8_t(min(len(privateData), 148)))
		go r.d.destroyID(r.id)
	})
	return nil
}

// Accept creates the queue pair, posts the receives and accepts; it
// returns once the connection is established.
func (r *request) Accept(p rdma.ConnParams) (rdma.QP, error) {
	var q *qp
	var err error
	r.once.Do(func() {
		q, err = r.d.newQP(r.id, p, r.local, r.remote)
		if err != nil {
			C.rdma_reject(r.id, nil, 0)
			go r.d.destroyID(r.id)
			return
		}
		// librdmacm reports a request's depths from our side: ird is
		// how many Reads the peer will have outstanding against us (its
		// ORD), ord how many it will answer (its IRD).
		ird := min(max(p.QP.IRD, r.ird, 1), r.d.info.MaxReadDepth, 255)
		ord := min(max(p.QP.ORD, 1), max(r.ord, 1), r.d.info.MaxReadDepth, 255)
		if err = q.join(p.PrivateData, 196, ird, ord, true); err != nil {
			q.destroy()
			return
		}
		if err = q.established(10*time.Second, nil); err != nil {
			q.Close() // accepted, never established: nothing stays behind
		}
	})
	if q == nil && err == nil {
		err = errors.New("verbs: the request was already answered")
	}
	if err != nil {
		return nil, err
	}
	return q, nil
}

// ---- dialing ----

// Dial implements rdma.Fabric: address and route resolution, then an
// RDMA/CM connect in the TCP port space. p.ServiceIDBase other than 0
// (the iSER-on-InfiniBand draft's iSER base, an SRP I/O controller's service ID) needs the
// InfiniBand CM without the RDMA/CM header, which librdmacm does not
// offer: refused.
func (d *Device) Dial(ctx context.Context, addr string, p rdma.ConnParams) (rdma.QP, []byte, error) {
	if p.ServiceIDBase != 0 {
		return nil, nil, fmt.Errorf("verbs: service ID base %#x: librdmacm connects in the RDMA/CM port space only (0x0106<<16 | port); the iSER-on-InfiniBand draft's iSER base and SRP I/O controller service IDs need the InfiniBand CM directly", p.ServiceIDBase)
	}
	ap, err := parseAddr(addr)
	if err != nil {
		return nil, nil, err
	}
	c := &dialing{ev: make(chan cmEvent, 8)}
	var id *cID
	if r, err := C.rdma_create_id(d.ech, &id, nil, C.RDMA_PS_TCP); r != 0 {
		return nil, nil, fmt.Errorf("verbs: rdma_create_id: %v", err)
	}
	if err := d.own(id, c); err != nil {
		C.rdma_destroy_id(id)
		return nil, nil, err
	}
	fail := func(err error) (rdma.QP, []byte, error) {
		d.destroyID(id)
		return nil, nil, err
	}
	sa := sockaddr(ap)
	defer C.free(unsafe.Pointer(sa))
	if r, err := C.rdma_resolve_addr(id, nil, sa, 2000); r != 0 {
		return fail(fmt.Errorf("verbs: connect to %s: rdma_resolve_addr: %v", addr, err))
	}
	if err := c.await(ctx, C.RDMA_CM_EVENT_ADDR_RESOLVED); err != nil {
		return fail(fmt.Errorf("verbs: connect to %s: %w", addr, err))
	}
	if v := C.bw_id_verbs(id); v != d.ctx {
		return fail(fmt.Errorf("verbs: %s is reached through RDMA device %s, not %s", addr, C.GoString(C.bw_ctx_name(v)), d.name))
	}
	if r, err := C.rdma_resolve_route(id, 2000); r != 0 {
		return fail(fmt.Errorf("verbs: connect to %s: rdma_resolve_route: %v", addr, err))
	}
	if err := c.await(ctx, C.RDMA_CM_EVENT_ROUTE_RESOLVED); err != nil {
		return fail(fmt.Errorf("verbs: connect to %s: %w", addr, err))
	}
	q, err := d.newQP(id, p, idAddr(id, true), idAddr(id, false))
	if err != nil {
		return fail(err)
	}
	ird := min(max(p.QP.IRD, 1), d.info.MaxReadDepth, 255)
	ord := min(max(p.QP.ORD, 1), d.info.MaxReadDepth, 255)
	if err := q.join(p.PrivateData, 56, ird, ord, false); err != nil {
		q.destroy()
		return nil, nil, fmt.Errorf("verbs: connect to %s: %w", addr, err)
	}
	var reply []byte
	if err := q.established(10*time.Second, &reply); err != nil {
		return nil, nil, err
	}
	return q, reply, nil
}

// dialing is an id on its way to a connection, until newQP makes the
// queue pair that then owns it.
type dialing struct{ ev chan cmEvent }

func (c *dialing) event(e cmEvent) {
	select {
	case c.ev <- e:
	default:
	}
}

func (c *dialing) await(ctx context.Context, want int) error {
	select {
	case e := <-c.ev:
		if e.typ == want {
			return nil
		}
		return fmt.Errorf("%s (status %d)", eventName(e.typ), e.status)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ---- queue pairs ----

const recvBit = 1 << 63 // wr_id of a receive; the rest is the slot

type sendSlot struct {
	id       uint64 // the consumer's
	op       rdma.Op
	signaled bool // a completion will come
	user     bool // and the consumer asked for it
	bounce   [][]byte
	sink     []byte // a Read through a bounce buffer lands here
	sinkMR   *cMR   // iWARP: the Read's own sink registration
	used     bool
	win      *window // a window's bind, or with inv its local invalidation
	inv      bool
}

type recvSlot struct {
	id     uint64
	user   []byte
	bounce []byte
	used   bool
}

// qp is a reliable connected queue pair on a Device.
type qp struct {
	d   *Device
	id  *cID
	num uint32 // the queue pair number (asynchronous events name it)
	// removed: the device-removal end happened (deviceRemoved).
	removed sync.Once
	cq      *cCQ
	cc      *cChannel
	ccf     *os.File
	cfg     rdma.QPConfig
	pd      *rdma.PD
	attr    rdma.QPAttr
	ev      chan cmEvent // connection events until established
	// iwarp: an RDMA Read's sink needs remote write rights there.
	iwarp bool
	debug bool // log every request and completion (log level debug)
	est   sync.Once
	up    chan struct{} // closed once established

	// Lock order: smu, rmu and mu are each taken alone.
	smu    sync.Mutex // posting sends; the send slots
	ssge   *cSGE
	sends  []sendSlot
	sfree  []int
	order  sendOrder
	unsig  int // unsignaled requests since the last signaled one
	sigOut int // signaled requests outstanding

	// Memory windows (Device.windows), guarded by smu: all of them, the
	// free ones, the bound ones by key.
	wins  []*window
	wfree []*window
	wkey  map[uint32]*window

	rmu   sync.Mutex // posting receives; the receive slots (lock order: rmu, then smu)
	rsge  *cSGE
	recvs []recvSlot
	rfree []int

	wc       *cWC
	bwc      *cBWWC
	pollDone chan struct{}

	mu      sync.Mutex
	err     error
	done    chan struct{}
	closing bool
	once    sync.Once
}

const pollBatch = 32

// newQP creates the completion channel, completion queue and queue pair
// on id and posts p.Recvs; the queue pair then owns id's events.
func (d *Device) newQP(id *cID, p rdma.ConnParams, local, remote net.Addr) (*qp, error) {
	cfg := p.QP
	cfg.Defaults()
	if p.PD != nil && p.PD.Memory() != nil && p.PD.Memory() != rdma.Memory(d.mem) {
		return nil, fmt.Errorf("verbs: the protection domain is not %s's", d.name)
	}
	pd := p.PD
	if pd == nil {
		pd = d.pd
	}
	q := &qp{d: d, id: id, cfg: cfg, pd: pd, ev: make(chan cmEvent, 8), up: make(chan struct{}),
		done: make(chan struct{}), pollDone: make(chan struct{})}
	q.attr = rdma.QPAttr{Transport: transportName(d.info.Kind), LocalAddr: local, RemoteAddr: remote}
	q.iwarp = d.info.Kind == "iWARP"
	q.debug = d.log.Enabled(context.Background(), slog.LevelDebug)
	var err error
	if q.cc, err = C.ibv_create_comp_channel(d.ctx); q.cc == nil {
		return nil, fmt.Errorf("verbs: ibv_create_comp_channel: %v", err)
	}
	sd, rd := cfg.SendDepth+1, cfg.RecvDepth
	if d.windows {
		// Each I/O adds up to two binds and two invalidations to the
		// send queue.
		sd = 4*cfg.SendDepth + 1
	}
	if q.cq, err = C.ibv_create_cq(d.ctx, C.int(sd+rd), nil, q.cc, 0); q.cq == nil {
		C.ibv_destroy_comp_channel(q.cc)
		return nil, fmt.Errorf("verbs: ibv_create_cq of %d entries: %v", sd+rd, err)
	}
	if r, err := C.bw_create_qp(id, d.cpd, q.cq, C.int(sd), C.int(rd), rdma.MaxSGE, 0); r != 0 {
		C.ibv_destroy_cq(q.cq)
		C.ibv_destroy_comp_channel(q.cc)
		return nil, fmt.Errorf("verbs: rdma_create_qp (%d sends, %d receives): %v", sd, rd, err)
	}
	if q.ccf, err = pollable(int(q.cc.fd), "completion channel"); err != nil {
		C.rdma_destroy_qp(id)
		C.ibv_destroy_cq(q.cq)
		C.ibv_destroy_comp_channel(q.cc)
		return nil, err
	}
	q.num = uint32(id.qp.qp_num)
	q.attr.Detail = fmt.Sprintf("device %s qpn %d", d.name, q.num)
	q.ssge = (*cSGE)(C.calloc(rdma.MaxSGE, C.size_t(unsafe.Sizeof(cSGE{}))))
	q.rsge = (*cSGE)(C.calloc(1, C.size_t(unsafe.Sizeof(cSGE{}))))
	q.wc = (*cWC)(C.calloc(pollBatch, C.size_t(unsafe.Sizeof(cWC{}))))
	q.bwc = (*cBWWC)(C.calloc(pollBatch, C.size_t(unsafe.Sizeof(cBWWC{}))))
	q.wkey = map[uint32]*window{}
	q.sends = make([]sendSlot, sd)
	for i := range q.sends {
		q.sfree = append(q.sfree, i)
	}
	q.recvs = make([]recvSlot, rd)
	for i := range q.recvs {
		q.rfree = append(q.rfree, i)
	}
	if err := d.own(id, q); err != nil {
		q.destroyQP()
		return nil, err
	}
	C.bw_arm(q.cq)
	go q.poll()
	for _, r := range p.Recvs {
		if err := q.PostRecv(r); err != nil {
			// The id stays the caller's: it rejects the request (or
			// ends the dial) and destroys it — destroying it here made
			// that reject touch a freed id.
			q.destroyQP()
			return nil, err
		}
	}
	return q, nil
}

func transportName(kind string) string {
	switch kind {
	case "RoCE":
		return "roce"
	case "iWARP":
		return "iwarp"
	}
	return "infiniband"
}

// join accepts (accept) or connects with the private data (at most max
// bytes: an InfiniBand REP or, after the RDMA/CM header, REQ holds no more)
// and the negotiated read depths.
func (q *qp) join(data []byte, max, ird, ord int, accept bool) error {
	q.attr.IRD, q.attr.ORD = ird, ord
	var pd unsafe.Pointer
	if len(data) > 0 {
		pd = C.CBytes(data)
		defer C.free(pd)
	}
	a, what := C.int(0), "rdma_connect"
	if accept {
		a, what = 1, "rdma_accept"
	}
	if r, err := C.bw_join(q.id, pd, C.int(min(len(data), max)), C.int(ird), C.int(ord), a); r != 0 {
		return fmt.Errorf("verbs: %s: %v", what, err)
	}
	return nil
}

// established waits for the connection to be up.
func (q *qp) established(timeout time.Duration, reply *[]byte) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case e := <-q.ev:
			switch e.typ {
			case C.RDMA_CM_EVENT_ESTABLISHED:
				if reply != nil {
					*reply = e.pdata
				}
				return nil
			case C.RDMA_CM_EVENT_REJECTED:
				q.destroy()
				return &rdma.RejectError{Reason: e.status, PrivateData: e.pdata}
			case C.RDMA_CM_EVENT_CONNECT_RESPONSE:
				continue
			}
			q.destroy()
			if e.typ == C.RDMA_CM_EVENT_CONNECT_ERROR {
				return fmt.Errorf("verbs: connection %s (status %d): %w", eventName(e.typ), e.status, rdma.ErrSetupFailed)
			}
			return fmt.Errorf("verbs: connection %s (status %d)", eventName(e.typ), e.status)
		case <-t.C:
			q.destroy()
			return fmt.Errorf("verbs: connection not established within %v", timeout)
		}
	}
}

// event takes the id's connection manager events.
func (q *qp) event(e cmEvent) {
	if e.typ == C.RDMA_CM_EVENT_ESTABLISHED {
		q.est.Do(func() { close(q.up) })
	}
	select {
	case <-q.up:
	default:
		select {
		case q.ev <- e:
		default:
		}
		return
	}
	switch e.typ {
	case C.RDMA_CM_EVENT_ESTABLISHED:
		select {
		case q.ev <- e:
		default:
		}
	case C.RDMA_CM_EVENT_DISCONNECTED:
		q.fail(rdma.ErrDisconnected)
	case C.RDMA_CM_EVENT_DEVICE_REMOVAL:
		q.deviceRemoved()
	}
}

// deviceRemoved ends the connection because its device is going away,
// saying so once — whichever id of the device hears of the removal first
// (a connection's own event may come after its queue pair already saw
// its receives flushed and began to close).
func (q *qp) deviceRemoved() {
	q.removed.Do(func() {
		err := fmt.Errorf("verbs: %s: %w", q.d.name, ErrDeviceRemoved)
		q.d.log.Error("verbs: RDMA device removed: the connection ends", "device", q.d.name, "peer", q.attr.RemoteAddr)
		q.fail(err)
		// A removed device flushes nothing: say it for it, so a consumer
		// waiting on its receive queue sees the end.
		q.cfg.RecvCQ.Push(rdma.Completion{Op: rdma.OpRecv, Status: rdma.Flushed, QP: q})
	})
}

// fail ends the connection with err (the first reason sticks).
func (q *qp) fail(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	select {
	case <-q.done:
		return
	default:
	}
	q.err = err
	close(q.done)
}

func (q *qp) PD() *rdma.PD          { return q.pd }
func (q *qp) Attr() rdma.QPAttr     { return q.attr }
func (q *qp) Done() <-chan struct{} { return q.done }
func (q *qp) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

func (q *qp) stopped() bool {
	select {
	case <-q.done:
		return true
	default:
		return false
	}
}

// local is the local key of b, or a bounce buffer of registered memory
// holding it (copied in when in is set).
func (q *qp) local(b []byte, in bool) (lkey uint32, buf []byte, bounce []byte, err error) {
	if k, ok := q.d.mem.LocalKey(b); ok {
		return k, b, nil, nil
	}
	nb, ok := q.d.mem.Alloc(len(b))
	if !ok {
		return 0, nil, nil, fmt.Errorf("verbs: no registered memory for a %d-byte bounce buffer (rdma_memory spent, or the locked-memory limit reached)", len(b))
	}
	if in {
		copy(nb, b)
	}
	k, _ := q.d.mem.LocalKey(nb)
	return k, nb, nb, nil
}

func setSGE(s *cSGE, b []byte, lkey uint32) {
	s.addr = C.uint64_t(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	s.length = C.uint32_t(len(b))
	s.lkey = C.uint32_t(lkey)
}

// PostSend implements rdma.QP.
func (q *qp) PostSend(wr *rdma.SendWR) error {
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.stopped() {
		return rdma.ErrClosed
	}
	if len(q.sfree) == 0 {
		return rdma.ErrQueueFull
	}
	i := q.sfree[len(q.sfree)-1]
	s := &q.sends[i]
	*s = sendSlot{id: wr.ID, op: wr.Op, user: !wr.Unsignaled, bounce: s.bounce[:0], used: true}
	release := func() {
		q.releaseSlot(s)
		s.used = false
	}
	var op C.int
	nsge := 0
	var raddr C.uint64_t
	var rkey C.uint32_t
	switch wr.Op {
	case rdma.OpSend, rdma.OpWrite:
		op = C.IBV_WR_SEND
		if wr.Op == rdma.OpWrite {
			op = C.IBV_WR_RDMA_WRITE
			raddr, rkey = C.uint64_t(wr.RemoteTO), C.uint32_t(wr.RemoteSTag)
		} else if wr.Invalidate {
			op = C.IBV_WR_SEND_WITH_INV
		}
		if len(wr.SG) > rdma.MaxSGE {
			release()
			return fmt.Errorf("verbs: %d buffers in one request (at most %d)", len(wr.SG), rdma.MaxSGE)
		}
		for _, b := range wr.SG {
			if len(b) == 0 {
				continue
			}
			k, buf, bounce, err := q.local(b, true)
			if err != nil {
				release()
				return err
			}
			if bounce != nil {
				s.bounce = append(s.bounce, bounce)
			}
			setSGE(C.bw_sge(q.ssge, C.int(nsge)), buf, k)
			nsge++
		}
	case rdma.OpRead:
		if wr.Sink == nil || wr.Length < 0 {
			release()
			return errors.New("verbs: RDMA Read without a sink")
		}
		op = C.IBV_WR_RDMA_READ
		raddr, rkey = C.uint64_t(wr.RemoteTO), C.uint32_t(wr.RemoteSTag)
		if wr.Length > 0 {
			sb := wr.Sink.Buf()
			if wr.SinkTO > uint64(len(sb)) || uint64(wr.Length) > uint64(len(sb))-wr.SinkTO {
				release()
				return fmt.Errorf("verbs: RDMA Read of %d bytes at %d beyond its %d-byte sink", wr.Length, wr.SinkTO, len(sb))
			}
			dst := sb[wr.SinkTO : wr.SinkTO+uint64(wr.Length)]
			k, buf, bounce, err := q.local(dst, false)
			if err != nil {
				release()
				return err
			}
			if bounce != nil {
				s.bounce = append(s.bounce, bounce)
				s.sink = dst
			}
			if q.iwarp && !q.d.opts.Remote {
				// iWARP places Read Responses like tagged writes: the
				// sink needs remote write rights, under an STag the
				// peer learns. So it gets its own registration, of
				// just these bytes, gone when the Read completes — not
				// the shared memory's, which no peer may write.
				mr, err := C.ibv_reg_mr(q.d.cpd, unsafe.Pointer(unsafe.SliceData(buf)), C.size_t(len(buf)),
					C.IBV_ACCESS_LOCAL_WRITE|C.IBV_ACCESS_REMOTE_WRITE)
				if mr == nil {
					release()
					return fmt.Errorf("verbs: registering a %d-byte RDMA Read sink: %v", len(buf), err)
				}
				s.sinkMR, k = mr, uint32(mr.lkey)
			}
			setSGE(C.bw_sge(q.ssge, 0), buf, k)
			nsge = 1
		}
	default:
		release()
		return fmt.Errorf("verbs: cannot post %v", wr.Op)
	}
	var flags C.int
	if wr.Fence {
		flags |= C.IBV_SEND_FENCE
	}
	if wr.Solicited {
		flags |= C.IBV_SEND_SOLICITED
	}
	// Unsignaled requests hold their send queue entries until a later
	// signaled one completes: every so often one is signaled anyway.
	s.signaled = s.user || q.unsig >= len(q.sends)/2
	if s.signaled {
		flags |= C.IBV_SEND_SIGNALED
	}
	if r, err := C.bw_post_send(q.id.qp, C.uint64_t(i), op, flags, C.uint32_t(wr.InvalidateSTag), raddr, rkey, q.ssge, C.int(nsge)); r != 0 {
		release()
		if err == nil {
			err = syscall.Errno(r)
		}
		return fmt.Errorf("verbs: ibv_post_send: %v", err)
	}
	if q.debug {
		q.d.log.Debug("verbs: posted", "qpn", q.attr.Detail, "slot", i, "op", wr.Op, "signaled", s.signaled, "sge", nsge,
			"remote_stag", fmt.Sprintf("%#x", wr.RemoteSTag), "remote_to", fmt.Sprintf("%#x", wr.RemoteTO), "length", wr.Length,
			"inv", wr.Invalidate, "sink_mr", s.sinkMR != nil)
	}
	q.posted(i, s.signaled)
	return nil
}

// posted takes send slot i out of the free list once its request is on
// the send queue. Called with smu held.
func (q *qp) posted(i int, signaled bool) {
	q.sfree = q.sfree[:len(q.sfree)-1]
	q.order.post(i)
	if signaled {
		q.unsig = 0
		q.sigOut++
	} else {
		q.unsig++
	}
}

// releaseSlot gives back what a send request held: bounce buffers, an
// iWARP sink registration. Called with smu held.
func (q *qp) releaseSlot(s *sendSlot) {
	for _, b := range s.bounce {
		q.d.mem.Free(b)
	}
	s.bounce = s.bounce[:0]
	if s.sinkMR != nil {
		C.ibv_dereg_mr(s.sinkMR)
		s.sinkMR = nil
	}
}

// PostRecv implements rdma.QP.
func (q *qp) PostRecv(wr rdma.RecvWR) error {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if q.stopped() {
		return rdma.ErrClosed
	}
	if len(q.rfree) == 0 {
		return rdma.ErrQueueFull
	}
	k, buf, bounce, err := q.local(wr.Buf, false)
	if err != nil {
		return err
	}
	i := q.rfree[len(q.rfree)-1]
	setSGE(q.rsge, buf, k)
	if r, err := C.bw_post_recv(q.id.qp, C.uint64_t(recvBit|uint64(i)), q.rsge); r != 0 {
		if bounce != nil {
			q.d.mem.Free(bounce)
		}
		if err == nil {
			err = syscall.Errno(r)
		}
		return fmt.Errorf("verbs: ibv_post_recv: %v", err)
	}
	q.rfree = q.rfree[:len(q.rfree)-1]
	q.recvs[i] = recvSlot{id: wr.ID, user: wr.Buf, bounce: bounce, used: true}
	return nil
}

// poll turns work completions into rdma completions. It waits on the
// completion channel between batches (the runtime's poller: no spinning)
// and ends once the queue pair is closing and nothing is outstanding, or
// when the channel's file is closed.
func (q *qp) poll() {
	defer close(q.pollDone)
	rc, err := q.ccf.SyscallConn()
	if err != nil {
		return
	}
	wcs := unsafe.Slice(q.bwc, pollBatch)
	for {
		n := int(C.bw_poll(q.cq, q.wc, q.bwc, pollBatch))
		if n < 0 {
			q.fail(errors.New("verbs: ibv_poll_cq failed"))
			return
		}
		for i := 0; i < n; i++ {
			q.complete(&wcs[i])
		}
		if n > 0 {
			continue
		}
		if q.drained() {
			return
		}
		// Empty: arm, look once more (a completion between the poll and
		// the arm raises no event), then wait for the channel.
		C.bw_arm(q.cq)
		if n = int(C.bw_poll(q.cq, q.wc, q.bwc, pollBatch)); n > 0 {
			for i := 0; i < n; i++ {
				q.complete(&wcs[i])
			}
			continue
		}
		werr := rc.Read(func(uintptr) bool {
			if r, err := C.bw_cq_event(q.cc); r != 0 && errors.Is(err, syscall.EAGAIN) {
				return false
			}
			return true
		})
		if werr != nil {
			return
		}
	}
}

// drained reports that the queue pair is closing and no request it
// would see a completion of is outstanding.
func (q *qp) drained() bool {
	q.mu.Lock()
	closing := q.closing
	q.mu.Unlock()
	if !closing {
		return false
	}
	q.smu.Lock()
	s := q.sigOut
	q.smu.Unlock()
	q.rmu.Lock()
	r := len(q.recvs) - len(q.rfree)
	q.rmu.Unlock()
	return s == 0 && r == 0
}

// wcStatus maps a work completion's status (per completion: a switch,
// not a map lookup).
func wcStatus(s C.int) rdma.Status {
	switch s {
	case C.IBV_WC_SUCCESS:
		return rdma.Success
	case C.IBV_WC_WR_FLUSH_ERR:
		return rdma.Flushed
	case C.IBV_WC_LOC_LEN_ERR:
		return rdma.LocalLength
	case C.IBV_WC_LOC_PROT_ERR, C.IBV_WC_MW_BIND_ERR:
		return rdma.LocalProtection
	case C.IBV_WC_REM_ACCESS_ERR:
		return rdma.RemoteAccess
	case C.IBV_WC_REM_OP_ERR, C.IBV_WC_REM_INV_REQ_ERR:
		return rdma.RemoteOperation
	}
	return rdma.TransportError
}

func (q *qp) complete(w *cBWWC) {
	if q.debug {
		q.d.log.Debug("verbs: completion", "qpn", q.attr.Detail, "wr_id", fmt.Sprintf("%#x", uint64(w.id)), "opcode", int(w.opcode),
			"status", int(w.status), "len", uint32(w.len), "flags", int(w.flags))
	}
	st := wcStatus(w.status)
	if st != rdma.Success && st != rdma.Flushed {
		// The hardware moved the queue pair to the error state: the
		// connection ends, with the reason.
		err := fmt.Errorf("verbs: %s: work completion error: %s (vendor error %#x)", q.d.name,
			C.GoString(C.ibv_wc_status_str(uint32(w.status))), uint32(w.vendor_err))
		// A connection already ending (the peer disconnected, or Close)
		// may see its last requests fail so (siw: local QP operation
		// error at a logout): that is its end, not a fault.
		level := slog.LevelWarn
		if q.stopped() {
			level = slog.LevelDebug
		}
		q.d.log.Log(context.Background(), level, "verbs: completion error: the connection ends", "device", q.d.name, "peer", q.attr.RemoteAddr,
			"status", C.GoString(C.ibv_wc_status_str(uint32(w.status))), "vendor_err", uint32(w.vendor_err))
		q.fail(err)
	}
	if uint64(w.id)&recvBit != 0 {
		i := int(uint64(w.id) &^ recvBit)
		q.rmu.Lock()
		if i >= len(q.recvs) || !q.recvs[i].used {
			q.rmu.Unlock()
			return
		}
		r := q.recvs[i]
		q.recvs[i] = recvSlot{}
		q.rfree = append(q.rfree, i)
		q.rmu.Unlock()
		n := int(w.len)
		if r.bounce != nil {
			if st == rdma.Success {
				copy(r.user, r.bounce[:min(n, len(r.bounce))])
			}
			q.d.mem.Free(r.bounce)
		}
		c := rdma.Completion{ID: r.id, Op: rdma.OpRecv, Status: st, Len: n, QP: q}
		if w.flags&C.IBV_WC_WITH_INV != 0 {
			c.Invalidated, c.STag = true, uint32(w.inv)
		}
		if q.d.windows && w.flags&(C.IBV_WC_WITH_INV|rxeWithInv) != 0 {
			// A peer that invalidated one of our windows uninvited
			// (we do not offer it): the key is dead, and must not be
			// invalidated again.
			q.remotelyInvalidated(uint32(w.inv))
		}
		q.cfg.RecvCQ.Push(c)
		return
	}
	// A send-queue completion. The unsignaled requests posted before it
	// are complete too and are released with it. Signaled ones before it
	// keep their place: they complete on their own — an RDMA Read can
	// complete after Sends posted behind it (siw does so), so a Send's
	// completion says nothing of an earlier Read.
	i := int(w.id)
	var out []rdma.Completion
	var stack [4]rdma.Completion
	out = stack[:0]
	q.smu.Lock()
	if i >= len(q.sends) || !q.sends[i].used {
		q.smu.Unlock()
		return
	}
	q.order.complete(i, func(j int) bool { return q.sends[j].signaled }, func(j int) {
		s := &q.sends[j]
		sst := rdma.Success
		if j == i {
			sst = st
		}
		if s.sink != nil && sst == rdma.Success {
			copy(s.sink, s.bounce[0])
		}
		if s.inv {
			// Whatever the status: done, or flushed because the queue
			// pair failed — either way the key reaches nothing now.
			q.windowDead(s.win)
		}
		q.releaseSlot(s)
		if s.signaled {
			q.sigOut--
		}
		if s.user {
			out = append(out, rdma.Completion{ID: s.id, Op: s.op, Status: sst, QP: q})
		}
		*s = sendSlot{bounce: s.bounce[:0]}
		q.sfree = append(q.sfree, j)
	})
	q.smu.Unlock()
	for _, c := range out {
		q.cfg.SendCQ.Push(c)
	}
}

// Close implements rdma.QP: disconnect, let the flushed completions
// drain (at most two seconds), free everything.
func (q *qp) Close() error {
	q.once.Do(func() {
		q.fail(nil)
		q.mu.Lock()
		q.closing = true
		q.mu.Unlock()
		C.rdma_disconnect(q.id)
		// Wake the poller so it sees closing.
		select {
		case <-q.pollDone:
		case <-time.After(2 * time.Second):
		}
		q.destroy()
	})
	return nil
}

// destroy frees the queue pair's resources and then its id; the poller
// is stopped first.
func (q *qp) destroy() {
	q.destroyQP()
	// Last: the device may be closing and waiting for its last id.
	q.d.destroyID(q.id)
}

// destroyQP frees the queue pair's resources but not its id.
func (q *qp) destroyQP() {
	q.fail(errors.New("verbs: queue pair destroyed"))
	q.ccf.Close()
	<-q.pollDone
	// Windows first: a bound window holds its queue pair (rxe waits for
	// the reference, then warns).
	q.smu.Lock()
	for _, w := range q.wins {
		if w.mw != nil {
			C.ibv_dealloc_mw(w.mw)
			w.mw = nil
		}
	}
	q.smu.Unlock()
	C.rdma_destroy_qp(q.id)
	C.ibv_destroy_cq(q.cq)
	C.ibv_destroy_comp_channel(q.cc)
	q.smu.Lock()
	for i := range q.sends {
		q.releaseSlot(&q.sends[i])
		q.sends[i] = sendSlot{}
	}
	for _, w := range q.wins {
		q.windowDead(w)
	}
	q.smu.Unlock()
	q.rmu.Lock()
	for i := range q.recvs {
		if q.recvs[i].bounce != nil {
			q.d.mem.Free(q.recvs[i].bounce)
		}
		q.recvs[i] = recvSlot{}
	}
	q.rmu.Unlock()
	C.free(unsafe.Pointer(q.ssge))
	C.free(unsafe.Pointer(q.rsge))
	C.free(unsafe.Pointer(q.wc))
	C.free(unsafe.Pointer(q.bwc))
}

// Memory windows (InfiniBand type 2): with Device.windows, the initiator's
// memory is registered for local access and binding only, and each I/O's
// buffer is reached under a window bound over just that buffer on the
// queue pair (ahead of the command that names it), ended by the target's
// Send with Invalidate or by a local invalidation once the I/O is done.
// So a peer reaches exactly what it was given, for as long as the I/O
// lasts — what Linux ib_iser gets from fast registration.

// rxeWithInv is how rxe's completions say "with invalidate": the kernel's
// IB_WC_WITH_INVALIDATE (1<<2) copied as is, which rdma-core's enum calls
// IBV_WC_IP_CSUM_OK (a flag of UD and raw queue pairs, never of ours).
// Only a key of one of our bound windows is taken from it.
const rxeWithInv = 1 << 2

// maxWindows bounds the windows of one queue pair (each I/O holds one or
// two while it runs).
const maxWindows = 1024

// Window states.
const (
	wFree         = iota // unbound: ready to bind
	wBound               // its key reaches the buffer
	wInvalidating        // a local invalidation is posted
	wDead                // the peer invalidated it; its owner has not let go yet
)

// window is one memory window; guarded by its queue pair's smu.
type window struct {
	q     *qp
	mw    *C.struct_ibv_mw
	rkey  uint32
	va    uint64
	state int
	free  []byte // registered memory to free once the key is dead
}

// Windows implements the hook rdma.PD.AllocMROn looks for: the queue
// pair's memory windows, or nil when the device does not use them.
func (q *qp) Windows() rdma.Windows {
	if !q.d.windows {
		return nil
	}
	return q
}

// BindWindow implements rdma.Windows.
func (q *qp) BindWindow(b []byte, access rdma.Access) (rdma.Window, error) {
	ch := q.d.mem.find(b)
	if ch == nil || len(b) == 0 {
		return nil, errors.New("verbs: a memory window over memory that is not registered")
	}
	flags := C.int(0)
	if access&rdma.RemoteRead != 0 {
		flags |= C.IBV_ACCESS_REMOTE_READ
	}
	if access&rdma.RemoteWrite != 0 {
		flags |= C.IBV_ACCESS_REMOTE_WRITE
	}
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.stopped() {
		return nil, rdma.ErrClosed
	}
	var w *window
	if n := len(q.wfree); n > 0 {
		w = q.wfree[n-1]
		q.wfree = q.wfree[:n-1]
	} else {
		if len(q.wins) >= maxWindows {
			return nil, fmt.Errorf("verbs: %d memory windows in use on one connection", len(q.wins))
		}
		mw, err := C.bw_alloc_mw(q.d.cpd)
		if mw == nil {
			return nil, fmt.Errorf("verbs: %s: ibv_alloc_mw: %v", q.d.name, err)
		}
		w = &window{q: q, mw: mw, rkey: uint32(C.bw_mw_rkey(mw))}
		q.wins = append(q.wins, w)
	}
	// A new key byte for each binding: the last one's key stays dead.
	key := w.rkey&^0xff | (w.rkey+1)&0xff
	addr := uint64(addrOf(b))
	err := q.postInternal(w, false, false, func(slot int, sf C.int) (C.int, error) {
		r, err := C.bw_post_bind(q.id.qp, C.uint64_t(slot), sf, w.mw, C.uint32_t(key), ch.handle.(*cMR),
			C.uint64_t(addr), C.uint64_t(len(b)), flags)
		return r, err
	})
	if err != nil {
		q.wfree = append(q.wfree, w)
		return nil, fmt.Errorf("verbs: binding a memory window: %w", err)
	}
	C.bw_mw_set_rkey(w.mw, C.uint32_t(key))
	delete(q.wkey, w.rkey)
	w.rkey, w.va, w.state = key, addr, wBound
	q.wkey[key] = w
	return w, nil
}

// RKey implements rdma.Window.
func (w *window) RKey() uint32 { return w.rkey }

// VA implements rdma.Window.
func (w *window) VA() uint64 { return w.va }

// Invalidate implements rdma.Window.
func (w *window) Invalidate(free []byte) {
	q := w.q
	q.smu.Lock()
	defer q.smu.Unlock()
	w.free = free
	if w.state == wBound && !q.stopped() {
		err := q.postInternal(w, true, true, func(slot int, sf C.int) (C.int, error) {
			r, err := C.bw_post_send(q.id.qp, C.uint64_t(slot), C.IBV_WR_LOCAL_INV, sf, C.uint32_t(w.rkey), 0, 0, nil, 0)
			return r, err
		})
		if err == nil {
			w.state = wInvalidating
			return
		}
		// The queue pair is failing: its windows reach nothing more.
	}
	switch w.state {
	case wInvalidating:
	case wFree:
		// Freed with its queue pair already.
		if free != nil {
			q.d.mem.Free(free)
		}
		w.free = nil
	default:
		q.windowDead(w)
	}
}

// remotelyInvalidated marks the window with key dead: the peer's Send
// with Invalidate ended it.
func (q *qp) remotelyInvalidated(key uint32) {
	q.smu.Lock()
	if w := q.wkey[key]; w != nil && w.state == wBound {
		w.state = wDead
	}
	q.smu.Unlock()
}

// windowDead makes w free again once its key reaches nothing, and frees
// the memory it was holding back. Called with smu held.
func (q *qp) windowDead(w *window) {
	if w == nil || w.state == wFree {
		return
	}
	if w.free != nil {
		q.d.mem.Free(w.free)
		w.free = nil
	}
	delete(q.wkey, w.rkey)
	w.state = wFree
	q.wfree = append(q.wfree, w)
}

// postInternal posts a request of the queue pair's own (a window's bind or
// local invalidation) in a send slot, signaled when signal is set (or when
// unsignaled ones pile up); no completion reaches the consumer. Called
// with smu held.
func (q *qp) postInternal(w *window, inv, signal bool, post func(slot int, flags C.int) (C.int, error)) error {
	if len(q.sfree) == 0 {
		return rdma.ErrQueueFull
	}
	i := q.sfree[len(q.sfree)-1]
	s := &q.sends[i]
	*s = sendSlot{bounce: s.bounce[:0], used: true, win: w, inv: inv}
	s.signaled = signal || q.unsig >= len(q.sends)/2
	flags := C.int(0)
	if s.signaled {
		flags = C.IBV_SEND_SIGNALED
	}
	if r, err := post(i, flags); r != 0 {
		*s = sendSlot{bounce: s.bounce[:0]}
		if err == nil {
			err = syscall.Errno(r)
		}
		return err
	}
	q.posted(i, s.signaled)
	return nil
}
