-- Back to migration 015: no watermark. The marks the migration wrote stay:
-- a due key is one the previous sweep finds too.
DROP TABLE /* TEMPLATE: schema */atomicphase_sweep_watermark;
