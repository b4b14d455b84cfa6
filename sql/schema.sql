-- babysitter database schema (PostgreSQL), generated from
-- babysitter/controller/db/models.py; migrations live in sql/versions/.

CREATE TABLE actions (
	id BIGSERIAL NOT NULL, 
	kind VARCHAR(32) NOT NULL, 
	node VARCHAR(64), 
	job_id BIGINT, 
	reason TEXT, 
	rule TEXT, 
	requested_by VARCHAR(64) NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	outcome TEXT, 
	dry_run BOOLEAN NOT NULL, 
	attempts INTEGER NOT NULL, 
	created_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	done_at TIMESTAMP WITH TIME ZONE, 
	next_attempt_at TIMESTAMP WITH TIME ZONE, 
	PRIMARY KEY (id)
);
CREATE INDEX ix_actions_kind_node ON actions (kind, node);
CREATE INDEX ix_actions_node_kind ON actions (node, kind);
CREATE INDEX ix_actions_status ON actions (status);

CREATE TABLE alerts (
	key VARCHAR(255) NOT NULL, 
	node VARCHAR(64), 
	condition VARCHAR(128) NOT NULL, 
	severity VARCHAR(16) NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	summary TEXT NOT NULL, 
	started_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	last_sent_at TIMESTAMP WITH TIME ZONE, 
	resolved_at TIMESTAMP WITH TIME ZONE, 
	sink_results JSON, 
	PRIMARY KEY (key)
);

CREATE TABLE audit_log (
	id BIGSERIAL NOT NULL, 
	at TIMESTAMP WITH TIME ZONE NOT NULL, 
	actor VARCHAR(128) NOT NULL, 
	kind VARCHAR(32) NOT NULL, 
	node VARCHAR(64), 
	job_id BIGINT, 
	action_id BIGINT, 
	rule TEXT, 
	reason TEXT, 
	result VARCHAR(16) NOT NULL, 
	outcome TEXT, 
	evidence JSON NOT NULL, 
	PRIMARY KEY (id)
);
CREATE INDEX ix_audit_at ON audit_log (at);
CREATE INDEX ix_audit_node_at ON audit_log (node, at);

CREATE TABLE jobs (
	job_id BIGSERIAL NOT NULL, 
	name VARCHAR(1024), 
	"user" VARCHAR(64), 
	nodes JSON NOT NULL, 
	state VARCHAR(64), 
	babysit JSON NOT NULL, 
	restart_count INTEGER NOT NULL, 
	requeues INTEGER NOT NULL, 
	resume_point TEXT, 
	history JSON NOT NULL, 
	first_seen_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	PRIMARY KEY (job_id)
);

CREATE TABLE kv (
	key VARCHAR(128) NOT NULL, 
	value JSON, 
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	PRIMARY KEY (key)
);

CREATE TABLE maintenance_windows (
	id BIGSERIAL NOT NULL, 
	nodes JSON NOT NULL, 
	hostlist TEXT NOT NULL, 
	reason TEXT NOT NULL, 
	created_by VARCHAR(128) NOT NULL, 
	starts_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	ends_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	ended_at TIMESTAMP WITH TIME ZONE, 
	reservation VARCHAR(128), 
	silence_id VARCHAR(64), 
	state VARCHAR(16) NOT NULL, 
	note TEXT, 
	PRIMARY KEY (id)
);
CREATE INDEX ix_maintenance_state ON maintenance_windows (state);

CREATE TABLE nodes (
	name VARCHAR(64) NOT NULL, 
	first_seen_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	last_report_at TIMESTAMP WITH TIME ZONE, 
	last_report_id VARCHAR(36), 
	last_sent_at TIMESTAMP WITH TIME ZONE, 
	open_findings JSON NOT NULL, 
	worst_severity VARCHAR(16) NOT NULL, 
	consecutive_clean INTEGER NOT NULL, 
	verdict VARCHAR(16) NOT NULL, 
	babysitter_drained BOOLEAN NOT NULL, 
	drain_reason TEXT, 
	drained_at TIMESTAMP WITH TIME ZONE, 
	slurm_state VARCHAR(64), 
	slurm_reason TEXT, 
	metrics JSON, 
	drain_episode BIGINT, 
	PRIMARY KEY (name)
);

CREATE TABLE remediations (
	id BIGSERIAL NOT NULL, 
	node VARCHAR(64) NOT NULL, 
	rung VARCHAR(16) NOT NULL, 
	fault_class VARCHAR(128) NOT NULL, 
	fault TEXT NOT NULL, 
	gpu_uuid VARCHAR(96), 
	gpu_serial VARCHAR(64), 
	state VARCHAR(16) NOT NULL, 
	open BOOLEAN NOT NULL, 
	requested_by VARCHAR(64) NOT NULL, 
	outcome TEXT, 
	evidence JSON NOT NULL, 
	created_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	done_at TIMESTAMP WITH TIME ZONE, 
	cleared_at TIMESTAMP WITH TIME ZONE, 
	PRIMARY KEY (id)
);
CREATE INDEX ix_remediations_gpu ON remediations (gpu_uuid);
CREATE INDEX ix_remediations_node_created ON remediations (node, created_at);
CREATE INDEX ix_remediations_open ON remediations (open);

CREATE TABLE reports (
	id BIGSERIAL NOT NULL, 
	report_id VARCHAR(36) NOT NULL, 
	node VARCHAR(64) NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	sent_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	received_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	n_findings INTEGER NOT NULL, 
	worst_severity VARCHAR(16) NOT NULL, 
	metrics JSON, 
	PRIMARY KEY (id), 
	UNIQUE (report_id)
);
CREATE INDEX ix_reports_node_received ON reports (node, received_at);
CREATE INDEX ix_reports_received ON reports (received_at);
CREATE INDEX ix_reports_worst_received ON reports (worst_severity, received_at);

CREATE TABLE rma_archives (
	id BIGSERIAL NOT NULL, 
	node VARCHAR(64) NOT NULL, 
	ledger_id BIGINT, 
	trigger TEXT NOT NULL, 
	order_id VARCHAR(36) NOT NULL, 
	action_id BIGINT, 
	state VARCHAR(16) NOT NULL, 
	outcome TEXT, 
	path TEXT, 
	size BIGINT, 
	sha256 VARCHAR(64), 
	alerted BOOLEAN NOT NULL, 
	created_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (order_id)
);
CREATE INDEX ix_rma_archives_node ON rma_archives (node, created_at);

CREATE TABLE sdc_schedule (
	node VARCHAR(64) NOT NULL, 
	hold VARCHAR(64), 
	order_id VARCHAR(36), 
	ordered_at TIMESTAMP WITH TIME ZONE, 
	last_attempt_at TIMESTAMP WITH TIME ZONE, 
	last_run_at TIMESTAMP WITH TIME ZONE, 
	last_code VARCHAR(64), 
	last_library VARCHAR(64), 
	last_message TEXT, 
	last_gflops JSON, 
	waiting TEXT, 
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	PRIMARY KEY (node)
);

CREATE TABLE findings (
	id BIGSERIAL NOT NULL, 
	report_id VARCHAR(36) NOT NULL, 
	node VARCHAR(64) NOT NULL, 
	"check" VARCHAR(64) NOT NULL, 
	component VARCHAR(128) NOT NULL, 
	severity VARCHAR(16) NOT NULL, 
	code VARCHAR(128) NOT NULL, 
	message TEXT NOT NULL, 
	action VARCHAR(16) NOT NULL, 
	observed_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	details JSON, 
	PRIMARY KEY (id), 
	FOREIGN KEY(report_id) REFERENCES reports (report_id) ON DELETE CASCADE
);
CREATE INDEX ix_findings_node_observed ON findings (node, observed_at);
CREATE INDEX ix_findings_report ON findings (report_id);
CREATE INDEX ix_findings_severity_observed ON findings (severity, observed_at);
