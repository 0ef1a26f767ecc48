-- onceflow schema, version 5: the sample workflows' tables leave the product schema.
-- onceflow_demo_side_effects (0001) and onceflow_demo_applied_effects (0004) belong to
-- the opt-in examples package, which creates them with its own migrations
-- (`onceflow migrate --with onceflow_examples`, recorded in onceflow_examples_migrations).
-- They only ever held the samples' pretend side effects.
DROP TABLE IF EXISTS onceflow_demo_side_effects;
DROP TABLE IF EXISTS onceflow_demo_applied_effects;
