-- babysitter: record the job's opt-in as AdminComment "babysit=<args>" (users cannot change
-- AdminComment, and it survives requeue). Sources, in order:
--   1. the SPANK plugin's job-control env BABYSIT=<args> (sbatch --babysit=...)
--   2. the fallback without the plugin: --comment=babysit=<args>
-- Install next to slurm.conf and set JobSubmitPlugins=lua.

local function from_spank_env(job_desc)
   local env = job_desc.spank_job_env
   if env == nil then
      return nil
   end
   -- 0-indexed array: pairs() sees every entry
   for _, kv in pairs(env) do
      local k, v = string.match(kv, "^([^=]+)=(.*)$")
      if k == "BABYSIT" or k == "SPANK_BABYSIT" then
         return v
      end
   end
   return nil
end

local function from_comment(job_desc)
   local c = job_desc.comment
   if c == nil then
      return nil
   end
   for token in string.gmatch(c, "%S+") do
      if token == "babysit" then
         return ""
      end
      local v = string.match(token, "^babysit=(.*)$")
      if v ~= nil then
         return v
      end
   end
   return nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   local val = from_spank_env(job_desc)
   if val == nil then
      val = from_comment(job_desc)
   end
   if val ~= nil then
      local tag = "babysit"
      if val ~= "" then
         tag = "babysit=" .. val
      end
      local existing = job_desc.admin_comment
      if existing ~= nil and existing ~= "" and not string.find(existing, "babysit", 1, true) then
         job_desc.admin_comment = existing .. " " .. tag
      else
         job_desc.admin_comment = tag
      end
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
